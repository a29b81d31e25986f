"""MFU against both peaks, each named: the datasheet's (the GPU catalogue row; a CPU's ISA
peak, threads x clock x FLOP/cycle) and this device's measured matmul ceiling. The run's
headline MFU is one of them (GPU: the datasheet; CPU: the measured ceiling), the same
figure on every surface."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.analysis.findings import both_mfu_words
from engine.hardware.devices import DeviceInfo, get_device
from engine.hardware.gpus import DATASHEET_TFLOPS
from engine.hardware.peaks import isa_peak, reference_peaks
from engine.schema import mfus_against
from engine.store import Store

APP = str(Path(__file__).resolve().parents[1] / "app.py")

H100 = DeviceInfo(key="cuda:0", kind="cuda", name="NVIDIA H100 80GB HBM3", capability="sm90",
                  memory_bytes=80 * 2**30, compute_capability=(9, 0))


def test_a_gpu_in_the_catalogue_has_its_datasheet_peak_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PRECISION_LAB_HOME", str(tmp_path))  # no measured record here
    peaks = reference_peaks(H100, "bf16")
    assert peaks["datasheet"]["flops_per_s"] == DATASHEET_TFLOPS["H100 SXM"]["bf16"] * 1e12
    assert peaks["datasheet"]["label"] == "datasheet dense bf16 peak of the H100 SXM, 989 TFLOP/s"
    assert peaks["measured"]["flops_per_s"] is None
    assert "engine check" in peaks["measured"]["label"]


def test_this_cpu_has_an_isa_peak_from_its_flags_and_clock():
    device = get_device("cpu")
    for dtype in ("fp32", "bf16"):
        flops, native, basis = isa_peak(device, dtype, threads=2, clock_ghz=3.0)
        assert flops and flops >= 2 * 3.0e9 * 16  # 16 FLOP/cycle at least (AVX2: 32, two FMA units)
        assert "2 thread(s) x 3.00 GHz x" in basis
        peaks = reference_peaks(device, dtype)
        assert peaks["datasheet"]["label"].startswith(f"ISA peak of this CPU for {dtype}: ")
        assert ("emulated" in peaks["datasheet"]["label"]) == (not native)


def test_a_beaten_peak_says_so_instead_of_an_mfu_above_100_percent():
    peaks = {"datasheet": {"flops_per_s": 100e12, "label": "datasheet"},
             "measured": {"flops_per_s": 10e12, "label": "measured"}}
    result = mfus_against(peaks, achieved_tflops=40.0)
    assert result["datasheet"]["mfu"] == pytest.approx(0.4)
    assert result["measured"]["mfu"] is None and "achieved more" in result["measured"]["note"]
    again = mfus_against(result, achieved_tflops=5.0)  # recomputed: no stale note
    assert again["measured"]["mfu"] == pytest.approx(0.5) and "note" not in again["measured"]
    words = both_mfu_words({"mfu_peaks": result})
    assert words.startswith("MFU 40.0 % against the datasheet peak (datasheet); n/a against "
                            "the measured ceiling (the run achieved more")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_run_reports_both_mfus_and_its_headline_is_one_of_them(cli, home):
    result = cli("run", "--model", "mlp", "--size", "tiny", "--device", "cpu", "--steps", "60",
                 "--no-profile", "--json", timeout=200)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    peaks = out["mfu_peaks"]
    assert set(peaks) == {"datasheet", "measured"}
    assert peaks["datasheet"]["label"].startswith("ISA peak of this CPU for fp32")
    summary = Store(home).get_run(out["run_id"]).summary
    # one basis: the headline MFU is against the ISA peak (a GPU: its datasheet peak)
    assert peaks["datasheet"]["mfu"] == pytest.approx(out["mfu"], rel=1e-9)
    assert peaks["datasheet"]["label"] == out["mfu_peak"]
    if peaks["measured"]["mfu"] is not None:  # a quiet measured ceiling, named beside it
        # and the what-if reads the same rate from the summary (no torch on the pages)
        assert summary["matmul_rates"]["fp32"] == peaks["measured"]["flops_per_s"]
    else:  # the peak was measured while busy (not kept): both say so, neither invents one
        assert peaks["measured"]["mfu"] is None and peaks["measured"]["label"]
    assert peaks["datasheet"]["mfu"] is not None and 0 < peaks["datasheet"]["mfu"] <= 1


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_three_modes_of_one_comparison_read_one_mfu_basis_on_every_surface(cli, home, capsys):
    """fp32, bf16-amp and fp16-amp: each MFU against the ISA peak of its own dtype (never
    n/a where that peak exists, never one mode against a measured ceiling and another
    against the ISA), and the same digits on Live, Compare, Runs, the report and the CLI."""
    from streamlit.testing.v1 import AppTest

    from engine.analysis.compare import display_names, summary_table
    from engine.analysis.summary_text import summary_strings
    from engine.cli.main import main as cli_main
    from engine.display import mfu_text
    from engine.report.html import build_html
    from engine.run.session import MFU_BASIS_SOURCE

    ids = []
    for mode in ("fp32", "bf16-amp", "fp16-amp"):
        done = cli("run", "--model", "mlp", "--size", "tiny", "--device", "cpu", "--steps",
                   "20", "--precision", mode, "--no-profile", "--json", timeout=200)
        assert done.returncode == 0, done.stderr[-2000:]
        ids.append(json.loads(done.stdout.strip().splitlines()[-1])["run_id"])
    store = Store(home)
    runs = {run_id: store.get_run(run_id) for run_id in ids}
    want = {}
    for run_id, run in runs.items():
        summary, dtype = run.summary, run.config.precision_mode.compute_dtype
        assert summary["peak_source"] == MFU_BASIS_SOURCE
        assert summary["peak_label"].startswith(f"ISA peak of this CPU for {dtype}")
        assert summary["mfu"] == pytest.approx(summary["mfu_peaks"]["datasheet"]["mfu"])
        want[run_id] = mfu_text(summary["mfu"])
        assert want[run_id] != "n/a"

    for run_id in ids:  # Live's tile, each run in its own session
        at = AppTest.from_file(APP, default_timeout=120)
        at.query_params["run"] = run_id
        at.run()
        at.switch_page("pages/live.py").run()
        assert not at.exception, at.exception
        assert {m.label: m.value for m in at.metric}["MFU"] == want[run_id]
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.query_params["runs"] = ",".join(ids)
    at.query_params["baseline"] = ids[0]
    at.switch_page("pages/compare.py").run()  # Compare's summary
    assert not at.exception, at.exception
    names = display_names(list(runs.values()))
    table = at.dataframe[0].value.set_index("run")
    assert {run_id: table.loc[names[run_id], "MFU"] for run_id in ids} == want
    at.switch_page("pages/runs.py").run()  # the Runs grid
    grid = at.dataframe[0].value.set_index("run_id")
    assert {run_id: grid.loc[run_id, "mfu"] for run_id in ids} == want
    full = summary_strings(summary_table(store, ids, ids[0]))  # the report's cells
    report = build_html(store, ids, ids[0])
    for run_id in ids:
        assert full[full["run id"] == run_id].iloc[0]["MFU"] == want[run_id]
        assert cli_main(["show", run_id]) == 0  # the CLI
        assert f"MFU                {want[run_id]}" in capsys.readouterr().out
    assert "n/a peak" not in report
