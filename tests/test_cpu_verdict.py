"""The CPU verdict from what ran: oneDNN's primitives weighted by their time, per kind of
matrix op, with the share in oneDNN's reference code deciding when it dominates; the same
words before a run (flags apart from this machine's oneDNN probe) on every surface; the
what-if projecting each kind of op at its own rate.

The logs under tests/data/onednn are real oneDNN 3.12 output captured on an AVX2 EPYC,
plus two files transcribed from a run reported on an AMX-BF16 / AVX512-FP16 Xeon
(tests/data/onednn/SOURCES.md says which is which)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.analysis.cpu_evidence import (
    EMULATED,
    NATIVE_AMX,
    NOT_APPLICABLE,
    REFERENCE,
    cpu_mode_words,
    cpu_verdict,
    kernels_verdict,
    kind_table,
    mode_words,
    parse_onednn_verbose,
    primitive_summary,
    reference_share,
    verdict_tone,
)
from engine.analysis.whatif import projection
from engine.config import RunConfig
from engine.diagnostics.check import cpu_evidence_rows
from engine.diagnostics.doctor import doctor_report
from engine.hardware.cpu_probe import RECORD_VERSION, stored_probe, write_probe
from engine.hardware.cpu_units import REFERENCE_UNIT, implementation_unit
from engine.hardware.devices import get_device
from engine.run.window import analyze_window

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "tests" / "data" / "onednn"
APP = str(ROOT / "app.py")
# An AMX-BF16 + AVX512-FP16 Xeon without AMX-FP16 (Sapphire Rapids class).
SPR = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"})


def _log(name: str) -> str:
    return (LOGS / name).read_text()


def _probe_dtype(log_name: str, conv_speed: float) -> dict:
    """One dtype of a probe record whose convolution ran what `log_name` shows."""
    primitives = [
        {
            "kind": p.kind,
            "prop_kind": p.prop_kind,
            "implementation": p.implementation,
            "isa": p.isa,
            "src_dtype": p.src_dtype,
            "problem": p.problem,
            "exec_ms": p.exec_ms,
        }
        for p in parse_onednn_verbose(_log(log_name))
        if p.is_matrix
    ]
    return {"ops": {"conv": {"wall_ms": 3600.0, "flop": 1e9, "flops_per_s": 1e9 * conv_speed,
                             "primitives": primitives},
                    "matmul": {"wall_ms": 1.0, "flop": 1e9, "flops_per_s": 1e12,
                               "primitives": []}},
            "speed_vs_fp32": {"conv": conv_speed, "matmul": 1.0}}


# ---------------------------------------------------------------------------------------
# real logs of this project's AVX2 machine


def test_avx2_fp32_log_names_each_pass_of_the_convolution_and_no_reference_code():
    prims = parse_onednn_verbose(_log("epyc-avx2_fp32.log"))
    table = kind_table(prims)
    assert [row["kind"] for row in table] == ["conv_forward", "conv_backward_data",
                                              "conv_backward_weights"]
    assert {row["implementation"] for row in table} == {"jit:avx2"}
    assert {row["unit"] for row in table} == {"AVX2 vector units (fp32 FMA)"}
    assert sum(row["share"] for row in table) == pytest.approx(1.0)
    assert reference_share(prims) == 0.0
    verdict = cpu_verdict(prims, "fp32", frozenset({"avx2"}))
    assert verdict["verdict"] == NOT_APPLICABLE and verdict["reference_share"] == 0.0
    assert verdict["by_kind"] == table
    json.dumps(verdict)  # stored in the summary as it is


def test_a_jit_gemm_without_an_isa_field_is_vector_code_not_reference_code():
    prims = parse_onednn_verbose(_log("epyc-avx2-max-isa-sse41_fp32.log"))
    backward = [p for p in prims if p.kind == "convolution" and p.prop_kind == "backward_data"]
    assert backward and backward[0].implementation == "x64:gemm:jit"
    assert not backward[0].is_reference and reference_share(prims) == 0.0
    assert implementation_unit("ref:any", "fp16") == REFERENCE_UNIT


def test_avx2_low_precision_logs_hold_no_primitive_and_the_verdict_says_emulated():
    for dtype in ("bf16", "fp16"):
        prims = parse_onednn_verbose(_log(f"epyc-avx2_{dtype}.log"))
        assert prims == []
        verdict = cpu_verdict(prims, dtype, frozenset({"avx2", "fma"}))
        assert verdict["verdict"] == EMULATED and verdict["reference_share"] is None
        assert "fell back to ATen's own code" in verdict["headline"]


# ---------------------------------------------------------------------------------------
# the reported Xeon: fp16 convolution backward weights in ref:any


def test_reference_code_at_most_of_the_matrix_time_decides_the_verdict():
    prims = parse_onednn_verbose(_log("xeon-amx-bf16-avx512-fp16_fp16.transcribed.log"))
    verdict = cpu_verdict(prims, "fp16", SPR)
    assert verdict["reference_share"] == pytest.approx(3454.0 / (3454.0 + 48.1 + 58.3))
    assert verdict["reference_share"] >= 0.5
    assert verdict["verdict"] == REFERENCE and verdict_tone(verdict["verdict"]) == "emulated"
    assert verdict["headline"].startswith(
        "fp16 convolutions ran oneDNN's reference code: 97 % of matrix time "
        "(backward weights: ref:any)")
    assert verdict["headline"].endswith("expect far slower than fp32")
    assert "AVX-512 FP16 vector units" not in verdict["headline"]
    # The deciding evidence first: a surface that shows four lines shows it.
    assert verdict["evidence"][0].startswith("convolution backward weights fp16 ref:any: 97")
    weights = next(row for row in verdict["by_kind"] if row["kind"] == "conv_backward_weights")
    assert weights["implementation"] == "ref:any" and weights["unit"] == REFERENCE_UNIT
    assert primitive_summary(verdict["primitives"])[0]["implementation"] == "ref:any"
    # `engine kernels` on such a run: the CPU evidence, not "no GPU kernels".
    shown = kernels_verdict(verdict)
    assert "No GPU kernels" not in shown["headline"] and "reference code" in shown["headline"]


def test_bf16_on_amx_is_native_and_a_small_reference_share_is_named_not_decisive():
    prims = parse_onednn_verbose(_log("xeon-amx-bf16-avx512-fp16_bf16.transcribed.log"))
    verdict = cpu_verdict(prims, "bf16", SPR)
    assert verdict["verdict"] == NATIVE_AMX and verdict["reference_share"] == 0.0
    # one pass in ref at 20 % of the matrix time: the unit stays, the share is said
    text = _log("xeon-amx-bf16-avx512-fp16_bf16.transcribed.log").replace(
        "brgconv_bwd_d:avx10_1_512_amx", "ref:any").replace(",14.9", ",11.4")
    partly = cpu_verdict(parse_onednn_verbose(text), "bf16", SPR)
    assert partly["verdict"] == NATIVE_AMX
    assert partly["headline"].endswith("of matrix time in oneDNN's reference code")


def test_the_unit_that_ran_most_of_the_time_names_the_run():
    """Time-weighted, not the most capable unit any primitive used: a tiny AMX matmul
    beside long conversion-code convolutions is an emulated run."""
    amx_matmul = ("onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core_amx,"
                  "undef,src:bf16::blocked:ab::f0 wei:bf16:a:blocked:ba::f0 "
                  "dst:bf16::blocked:ab::f0,,,16x32:32x32,0.01\n")
    slow_conv = _log("xeon-amx-bf16-avx512-fp16_bf16.transcribed.log").replace(
        "avx10_1_512_amx", "avx512_core")
    verdict = cpu_verdict(parse_onednn_verbose(amx_matmul + slow_conv), "bf16", SPR)
    assert verdict["verdict"] == EMULATED
    assert "bf16 primitives ran on avx512_core, which converts" in verdict["headline"]


# ---------------------------------------------------------------------------------------
# before a run: flags apart from the probe, one function for every surface


def test_mode_words_keep_the_flags_apart_from_the_probe():
    probe = _probe_dtype("xeon-amx-bf16-avx512-fp16_fp16.transcribed.log", conv_speed=0.03)
    words = cpu_mode_words(SPR, "fp16", probe)
    assert words["known"].startswith("flags: fp16 matmuls on AVX-512 FP16 vector units")
    assert words["measured"].startswith(
        "measured: fp16 convolutions ran oneDNN's reference code in this machine's probe")
    assert words["tone"] == "emulated" and words["reference_share"] >= 0.5
    assert words["words"] == f"{words['known']}; {words['measured']}"
    unmeasured = cpu_mode_words(SPR, "fp16")
    assert unmeasured["measured"] is None and "not measured on this machine" in unmeasured["words"]
    assert unmeasured["tone"] == "native"
    bf16 = cpu_mode_words(SPR, "bf16", _probe_dtype(
        "xeon-amx-bf16-avx512-fp16_bf16.transcribed.log", conv_speed=6.0))
    assert bf16["tone"] == "native" and "brgconv_bwd_w:avx10_1_512_amx" in bf16["words"]


@pytest.fixture
def probed_cpu(home):
    """This machine's CPU with a stored probe whose fp16 convolutions ran reference code
    (the reported Xeon's primitives), so every surface has the same thing to word."""
    device = get_device("cpu")
    fp32 = _probe_dtype("epyc-avx2_fp32.log", conv_speed=1.0)
    fp16 = _probe_dtype("xeon-amx-bf16-avx512-fp16_fp16.transcribed.log", conv_speed=0.03)
    write_probe(device.key, device.name, {
        "version": RECORD_VERSION, "measured_at": 0.0, "source": "test",
        "device_name": device.name, "dtypes": {"fp32": fp32, "fp16": fp16,
                                               "bf16": {"ops": {}, "speed_vs_fp32": {}}}})
    assert stored_probe(device.key, device.name) is not None
    return device


def test_every_surface_before_a_run_says_the_same_words(probed_cpu):
    device = probed_cpu
    expected = mode_words(device, "fp16-amp")
    assert "fp16 convolutions ran oneDNN's reference code" in expected["words"]
    assert expected["tone"] == "emulated"
    # doctor (text and JSON print this reason)
    report = doctor_report(probe=False)
    cpu = next(dev for dev in report["devices"] if dev["kind"] == "cpu")
    assert cpu["modes"]["fp16-amp"]["reason"] == expected["words"]
    # the CPU check's line for fp16 (its evidence rows: the implementation per pass)
    rows = cpu_evidence_rows(json.loads(json.dumps(
        _probe_dtype("xeon-amx-bf16-avx512-fp16_fp16.transcribed.log", 0.03))))
    assert rows[0]["implementation"] == "ref:any" and rows[0]["unit"] == REFERENCE_UNIT
    # Launch and the device card
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["precision"] = "fp16-amp"
    at.session_state["device"] = "cpu"  # also where a GPU would be the default
    at.run()
    assert not at.exception, at.exception
    shown = " ".join(box.value.replace("\\", "") for box in at.warning)
    assert expected["words"] in shown, shown
    card = " ".join(md.value.replace("\\", "") for md in at.sidebar.markdown)
    assert expected["words"] in card


def test_kernels_and_live_lead_with_the_deciding_evidence(store):
    run_id = store.create_run(RunConfig(model="resnet", precision="fp16-amp"), "cpu",
                              "test cpu")
    log = store.run_dir(run_id) / "onednn_verbose.log"
    log.write_text(_log("xeon-amx-bf16-avx512-fp16_fp16.transcribed.log"))
    summary = analyze_window(store, run_id, "cpu", None, log, "fp16")
    evidence = summary["cpu_evidence"]
    assert evidence["reference_share"] >= 0.5 and evidence["verdict"] == REFERENCE
    assert store.get_run(run_id).summary["cpu_evidence"]["by_kind"] == evidence["by_kind"]
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["live_run_id"] = run_id
    at.run()
    at.switch_page("pages/kernels.py").run()
    assert not at.exception, at.exception
    assert not any("CPU matrix unit" in box.value for box in at.success)  # never green
    assert any("reference code" in box.value for box in at.warning)
    at.switch_page("pages/live.py").run()
    assert not at.exception, at.exception
    captions = " ".join(c.value for c in at.caption)
    assert "convolution backward weights fp16 ref:any" in captions


# ---------------------------------------------------------------------------------------
# the what-if: a convolution at the conv rate


def _cpu_accounting() -> dict:
    """A CPU resnet-like step: 100 ms, 80 ms of it matrix ops, 70 ms of those convolutions."""
    return {"kind": "cpu", "step_time_us": 100_000.0,
            "parts_per_step_us": {"matrix": 80_000.0, "elementwise": 20_000.0},
            "ops": [{"cpu_op": "aten::mkldnn_convolution", "part": "matrix",
                     "self_us": 70_000.0, "count": 10},
                    {"cpu_op": "aten::addmm", "part": "matrix", "self_us": 10_000.0,
                     "count": 2}]}


def test_the_what_if_projects_convolutions_at_the_conv_rate():
    result = {"accounting": _cpu_accounting(), "matrix_dtype": "fp32", "device": "test cpu"}
    matmul_rates = {"fp32": 100e9, "fp16": 101e9}  # fp16 matmuls about fp32 speed
    at_matmul_rate = projection(result, matmul_rates)
    fp16 = next(t for t in at_matmul_rate["targets"] if t["target"] == "fp16 on this device")
    assert fp16["speedup"] > 1.0  # the wrong answer the conv rate corrects
    assert "at the matmul rate: no conv rate measured here" in fp16["basis"]
    op_rates = {"matmul": {"fp32": 50e9, "fp16": 50e9},
                "conv": {"fp32": 40e9, "fp16": 1.2e9}}  # fp16 conv in reference code
    projected = projection(result, matmul_rates, op_rates)
    fp16 = next(t for t in projected["targets"] if t["target"] == "fp16 on this device")
    expected_us = 20_000.0 + 10_000.0 * 100 / 101 + 70_000.0 * 40 / 1.2
    assert fp16["projected_step_us"] == pytest.approx(expected_us)
    assert fp16["speedup"] < 0.1 and "slower" in fp16["words"]
    assert "convolutions (88 % of the matrix time) at the conv rate" in fp16["basis"]
    assert projected["current"]["conv_share"] == pytest.approx(0.875)


def test_without_a_stored_matmul_peak_the_probe_gives_both_sides_of_the_matmul_part():
    result = {"accounting": _cpu_accounting(), "matrix_dtype": "fp32", "device": "test cpu"}
    op_rates = {"matmul": {"fp32": 50e9, "fp16": 5e9}, "conv": {"fp32": 40e9, "fp16": 4e9}}
    projected = projection(result, None, op_rates)
    assert projected["current"]["basis"] == "this CPU's oneDNN probe"
    fp16 = next(t for t in projected["targets"] if t["target"] == "fp16 on this device")
    assert fp16["projected_step_us"] == pytest.approx(20_000.0 + 80_000.0 * 10)
    # a peak stored for today's dtype only: the probe's ratio, on the peak's scale
    scaled = projection(result, {"fp32": 100e9}, op_rates)
    fp16 = next(t for t in scaled["targets"] if t["target"] == "fp16 on this device")
    assert fp16["target_flops_per_s"] == pytest.approx(10e9)


def _check_line(dtype: str, probe_dtype: dict, tone: str) -> dict:
    return {"test": "matmul", "dtype": dtype, "value": 10.0, "unit": "GFLOP/s", "peak": 150.0,
            "ratio_to_peak": 10.0 / 150.0, "speedup_vs_fp32": 1.0, "verdict": "ok",
            "reason": "native", "kernels": cpu_evidence_rows(probe_dtype), "cpu_tone": tone,
            "peak_source": "ISA peak: 2 thread(s) x 2.45 GHz x 32 FLOP/cycle = 157 GFLOP/s"}


def test_the_cpu_check_page_shows_each_dtypes_onednn_implementations_and_the_isa_peak(home):
    device = get_device("cpu")
    result = {"device": {"key": "cpu", "kind": "cpu", "name": device.name},
              "lines": [_check_line("fp32", _probe_dtype("epyc-avx2_fp32.log", 1.0), "neutral"),
                        _check_line("fp16", _probe_dtype(
                            "xeon-amx-bf16-avx512-fp16_fp16.transcribed.log", 0.03), "emulated")],
              "nvml": None, "nvml_reason": "no NVML", "elapsed_s": 1.0, "time_budget_s": 45.0,
              "onednn_probe_error": None}
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["check_results"] = {"cpu": result}
    at.run()
    at.switch_page("pages/check.py").run()
    assert not at.exception, at.exception
    assert "oneDNN evidence" in [header.value for header in at.subheader]
    labels = [expander.label for expander in at.expander]
    assert "fp16: reference code or far slower than fp32" in labels, labels
    assert "fp32: oneDNN implementations" in labels
    assert any("ISA peak" in caption.value for caption in at.caption)
    assert not any("No datasheet peak" in caption.value for caption in at.caption)


def test_a_probe_timed_while_busy_says_its_speeds_are_rough():
    probe = {**_probe_dtype("epyc-avx2_fp32.log", 0.2), "busy": True}
    words = cpu_mode_words(frozenset({"avx2"}), "fp16", probe)
    assert ("conv 5x slower than fp32; matmul 1.00x fp32 (timed while the machine was busy: "
            "rough)") in words["words"]
