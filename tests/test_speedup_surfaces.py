"""Every surface gives the same figure and the same verdict: a real speedup check and real
runs measured with and without a competing CPU hog, seen through Live, Compare, the HTML
report, the CLI and the Runs table (AppTest against the real store)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from bench._hog import cpu_hog
from engine.analysis.compare import summary_table
from engine.analysis.findings import findings
from engine.display import ratio_text
from engine.report.html import build_html
from engine.schema import FINAL_STATUSES
from engine.store import Store
from tests.chart_support import chart_specs

APP = str(Path(__file__).resolve().parent.parent / "app.py")
pytestmark = pytest.mark.slow


def _json(proc) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    assert not at.exception, at.exception
    return at


def _text(at: AppTest) -> str:
    parts = [e.value for kind in ("markdown", "caption", "warning", "info", "error", "success")
             for e in getattr(at, kind)]
    return re.sub(r"\\(.)", r"\1", "\n".join(str(p) for p in parts))


def _wait_final(store: Store, run_id: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while store.get_run(run_id).status not in FINAL_STATUSES:
        assert time.monotonic() < deadline, f"{run_id} did not end"
        time.sleep(0.3)


@pytest.mark.timeout(400)
def test_a_speedup_check_launched_from_the_page_shows_on_live_compare_and_the_report(home, store):
    at = _app()
    at.selectbox(key="device").set_value("cpu")
    at.selectbox(key="model").set_value("mlp").run()
    at.multiselect(key="speedup_modes").set_value(["fp32", "bf16-amp"])
    at.number_input(key="speedup_budget_s").set_value(30.0).run()  # set-up included
    at.button(key="speedup_check").click().run()
    assert not at.exception, at.exception
    (check,) = store.list_runs()
    assert check.config.speedup_mode_list == ["fp32", "bf16-amp"]
    assert check.config.speedup_budget_s == 30.0 and check.config.precision == "fp32"
    _wait_final(store, check.id)
    check = store.get_run(check.id)
    assert check.status == "finished", check.reason
    result = check.summary["speedup"]
    bf16 = result["modes"][1]

    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["run"] = check.id
    at.run()
    at.switch_page("pages/live.py").run()
    assert not at.exception, at.exception
    titles = [spec["layout"]["title"]["text"] for spec in chart_specs(at)]
    assert any(t.startswith("Speedup vs fp32 (95 % interval)") for t in titles), titles
    table = at.dataframe[0].value
    shown = table.set_index("mode").loc["bf16-amp"]
    assert shown["speedup"] == ratio_text(bf16["speedup"])  # as every surface writes a ratio
    assert shown["verdict"].startswith(bf16["words"])
    text = _text(at)
    assert "rounds of" in text and "interleaved in one process" in text
    # A check logs no metric rows: no export buttons, no batch search, only re-launch.
    assert not at.get("download_button")
    assert [b.label for b in at.button] == ["Re-launch with this config"]

    at.query_params["runs"] = check.id
    at.switch_page("pages/compare.py").run()
    assert not at.exception, at.exception
    assert "Speedup checks" in [h.value for h in at.subheader]
    report = build_html(store, [check.id])
    assert "Speedup checks (paired: the figures to quote)" in report
    assert bf16["words"].replace("'", "&#x27;") in report


@pytest.mark.timeout(500)
def test_runs_measured_under_a_cpu_hog_are_never_stated_as_a_speedup(home, cli):
    args = ["--model", "mlp", "--steps", "60", "--batch-size", "32", "--no-profile", "--json"]
    with cpu_hog(processes=2):
        base = _json(cli("run", "--precision", "fp32", *args, timeout=240))
        other = _json(cli("run", "--precision", "bf16-amp", *args, timeout=240))
    store = Store(home)
    runs = [store.get_run(base["run_id"]), store.get_run(other["run_id"])]
    for run in runs:
        assert run.summary["contention"]["busy"] is True, run.summary["contention"]
        marks = store.read_metrics(run.id, max_points=None)
        assert marks.loc[marks["phase"] == "steady", "host_busy"].mean() >= 0.5

    # One figure everywhere: CLI, Runs row, Compare table and the summary agree.
    table = summary_table(store, [r.id for r in runs]).set_index("run_id")
    for run, cli_result in zip(runs, (base, other)):
        assert cli_result["samples_per_s"] == pytest.approx(run.summary["samples_per_s"])
        assert table.loc[run.id, "samples_per_s"] == pytest.approx(run.summary["samples_per_s"])
        assert run.summary["throughput_basis"] == "median over steady-state steps"
        # the MFU too: Live reads the summary, Compare and the report the table
        for key in ("mfu", "achieved_tflops"):
            assert (cli_result.get(key) is None) == (run.summary.get(key) is None), key
            if run.summary.get(key) is not None:
                assert cli_result[key] == pytest.approx(run.summary[key]), key
                assert table.loc[run.id, key] == pytest.approx(run.summary[key]), key

    text = findings(table.reset_index(), runs)
    line = next(t for t in text if t.startswith("bf16-amp:"))
    assert "not a speedup figure" in line and "machine was busy" in line
    assert not re.search(r"\d(\.\d+)?x (faster|slower) than", line)
    report = build_html(store, [r.id for r in runs])
    assert "busy: unreliable" in report and "throughput figures are unreliable" in report

    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["run"] = runs[1].id
    at.run()
    at.switch_page("pages/live.py").run()
    assert not at.exception, at.exception
    assert any("throughput figures are unreliable" in w.value for w in at.warning)
    at.switch_page("pages/runs.py").run()
    assert not at.exception, at.exception
