"""Why B is faster than A (engine.traces.explain.explain_diff) on two real CPU runs of this
machine, fp32 against bf16-amp, trained here by the project's own trainer with the profiler
on; on two real GPU traces; and through `python -m engine kernels A B --diff`.

The parts must add up to each run's step time as measured from its trace (first to last CPU
event over the number of optimizer steps, computed here from the raw JSON) within 2 %.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.analysis.cpu_evidence import cpu_verdict, parse_onednn_verbose
from engine.traces.accounting import CAST_OPS, PARTS
from engine.traces.explain import analyze, explain_diff

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "traces"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory) -> dict[str, Path]:
    """Two tiny real runs (a second or two each), profiler window of 3 + 1 steps."""
    from _real_runs import tiny_config

    from engine.training.loop import train

    runs = {}
    for precision in ("fp32", "bf16-amp"):
        run_dir = tmp_path_factory.mktemp(precision.replace("-", "_"))
        cfg = tiny_config(precision, steps=8, warmup_steps=2, profile=True, profile_steps=3)
        result = train(cfg, "cpu", emit=lambda rows: None, run_dir=run_dir)
        assert result.trace_path, f"{precision}: the trainer wrote no trace"
        runs[precision] = run_dir
    return runs


def measured_step_us(trace: Path) -> float:
    """From the raw events: (last CPU event end - first start) / optimizer steps."""
    with gzip.open(trace, "rt") as handle:
        events = [e for e in json.load(handle)["traceEvents"]
                  if e.get("cat") in ("cpu_op", "user_annotation") and "dur" in e]
    start = min(e["ts"] for e in events)
    end = max(e["ts"] + e["dur"] for e in events)
    steps = sum(1 for e in events if e["name"].startswith("Optimizer.step#"))
    return (end - start) / steps


def test_cpu_fp32_vs_bf16_parts_add_up_to_the_measured_steps(cpu_runs):
    fp32, bf16 = (cpu_runs[p] / "trace.json.gz" for p in ("fp32", "bf16-amp"))
    diff = explain_diff(fp32, bf16, label_a="fp32", label_b="bf16-amp")
    assert diff["kind"] == "cpu" and [row["part"] for row in diff["parts"]] == list(PARTS)
    for side, trace in (("a", fp32), ("b", bf16)):
        measured = measured_step_us(trace)
        parts_sum = sum(row[f"{side}_us"] for row in diff["parts"])
        assert parts_sum == pytest.approx(measured, rel=0.02), side
        assert diff[f"step_time_{side}_us"] == pytest.approx(measured, rel=0.02), side
    # the ratio is kept to 3 decimals: within half a unit of the last one, whatever its size
    assert diff["step_speedup"] == pytest.approx(diff["step_time_a_us"] / diff["step_time_b_us"],
                                                 abs=5e-4)
    assert diff["sentence"].endswith(f"-> step {_words(diff['step_speedup'])}")
    assert "of the fp32 step" in diff["sentence"]
    # autocast casts exist only in the bf16 run
    casts = [row for row in diff["only_in_b"] if row["note"] == "cast (dtype conversion)"]
    assert any("ToCopyBackward0" in row["name"] for row in casts)
    # an autograd node once, not again as the profiler's span around it
    assert not any(row["name"].startswith("autograd::engine::evaluate_function")
                   for row in diff["only_in_a"] + diff["only_in_b"])
    assert json.loads(json.dumps(diff)) == diff


def _words(speedup: float) -> str:
    if abs(speedup - 1) <= 0.05:
        return "unchanged (1.0x)"
    return f"{speedup:.1f}x faster" if speedup > 1 else f"{1 / speedup:.1f}x slower"


def test_cpu_run_accounting_shows_casts_and_the_onednn_primitive(cpu_runs):
    results = {}
    for precision, run_dir in cpu_runs.items():
        primitives = parse_onednn_verbose((run_dir / "onednn_verbose.log").read_text())
        evidence = cpu_verdict(primitives, "bf16" if precision == "bf16-amp" else "fp32")
        results[precision] = (analyze(run_dir / "trace.json.gz", cpu_evidence=evidence),
                              primitives)
    for precision, (result, primitives) in results.items():
        accounting = result["accounting"]
        # The window is profile_steps + 1 steps: the first records the oneDNN evidence
        # (verbose on), the profiler traces the other 3 (verbose off, so times are honest).
        assert accounting["kind"] == "cpu" and accounting["window"]["step_count"] == 3
        assert result["banner"]["headline"].startswith("CPU run: ")
        assert "cuBLAS" not in json.dumps(result["banner"])
        matrix = {row["cpu_op"]: row for row in accounting["matrix_ops"]}
        assert "aten::addmm" in matrix
        bf16_matmuls = [p for p in primitives if p.kind == "matmul" and p.src_dtype == "bf16"]
        if precision == "bf16-amp" and bf16_matmuls:
            assert bf16_matmuls[0].implementation in matrix["aten::addmm"]["onednn"]
    # Autocast adds dtype conversions: counted by calls, which load cannot change (an fp32
    # run's few copies can take longer than the bf16 run's many on a busy machine).
    calls = {precision: cast_calls(run_dir / "trace.json.gz")
             for precision, run_dir in cpu_runs.items()}
    assert calls["bf16-amp"] > calls["fp32"], calls
    assert results["bf16-amp"][0]["accounting"]["cast_us"] > 0


def cast_calls(trace: Path) -> int:
    with gzip.open(trace, "rt") as handle:
        return sum(1 for event in json.load(handle)["traceEvents"]
                   if event.get("cat") == "cpu_op" and event.get("name") in CAST_OPS)


def test_two_gpu_traces():
    diff = explain_diff(TRACES / "v100_resnet50_kineto_v1.json.gz",
                        TRACES / "h100_qwen_tracelens.json.gz")
    assert (diff["label_a"], diff["label_b"]) == ("fp32", "bf16")
    for side in ("a", "b"):
        assert sum(row[f"{side}_us"] for row in diff["parts"]) == pytest.approx(
            diff[f"step_time_{side}_us"], abs=0.05)
    assert diff["step_time_a_us"] == pytest.approx(1049317.0 / 6, abs=1e-3)
    matrix = next(row for row in diff["parts"] if row["part"] == "matrix")
    assert matrix["speedup"] == pytest.approx(matrix["a_us"] / matrix["b_us"], rel=1e-3)
    assert diff["sentence"].startswith("Idle 44 % of the fp32 step")
    assert any(row["note"] and "fp32 matrix kernel" in row["note"] for row in diff["only_in_a"])


def test_gpu_against_cpu_trace_is_refused(cpu_runs):
    with pytest.raises(ValueError, match="cannot compare a GPU trace .* with a CPU trace"):
        explain_diff(TRACES / "h100_bert_small_tracelens.json.gz",
                     cpu_runs["fp32"] / "trace.json.gz")


# --- CLI --------------------------------------------------------------------------------


def _engine(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_cli_diff_text_and_json(cpu_runs):
    a, b = (str(cpu_runs[p] / "trace.json.gz") for p in ("fp32", "bf16-amp"))
    text = _engine("kernels", a, b, "--diff")
    assert text.returncode == 0, text.stderr
    assert "-> step" in text.stdout and "Only in B" in text.stdout
    result = _engine("kernels", a, b, "--diff", "--json")
    assert result.returncode == 0, result.stderr
    diff = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"parts", "sentence", "only_in_a", "only_in_b", "step_speedup"} <= set(diff)


def test_cli_json_carries_the_accounting():
    result = _engine("kernels", str(TRACES / "a100_conv_nccl_hta.json.gz"), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["bound_by"]["verdict"] == "cpu_launch"
    assert summary["busy_us"] == pytest.approx(157500.078, abs=1e-3)
    assert summary["overlap_us"] == pytest.approx(7317.026, abs=1e-3)
    assert summary["copy_us"] == pytest.approx(2653.57, abs=1e-3)
    assert [row["stream"] for row in summary["streams"]] == [7, 40]
    assert [row["step"] for row in summary["steps"]] == [4, 5, 6]


@pytest.mark.parametrize("argv, words", [
    (["--diff"], "--diff needs two traces"),
    (["B.json"], "given without --diff"),
    (["--step", "12"], "no ProfilerStep#12"),
    (["--step", "x"], "--step 'x': expected a whole number"),
])
def test_cli_usage_errors_exit_2_naming_the_field(argv, words):
    result = _engine("kernels", str(TRACES / "h100_bert_small_tracelens.json.gz"), *argv)
    assert result.returncode == 2
    assert words in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_warns_about_bad_durations_and_never_prints_negative_time(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7,
         "ts": 0, "dur": 10, "args": {"stream": 7, "device": 0}},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7,
         "ts": 20, "dur": -0.04, "args": {"stream": 7, "device": 0, "bytes": 4}}]}))
    result = _engine("kernels", str(path))
    assert result.returncode == 0, result.stderr
    assert "1 event(s) with a missing, negative or impossible time" in result.stderr
    assert "-0.0" not in result.stdout


def test_an_impossible_timestamp_is_a_defect_not_a_window_of_ages(tmp_path):
    """A 1e308 us timestamp once made the window 1e305 ms wide (and inf/nan before);
    it is left out, counted and warned about, and the figures are those of the rest."""
    from engine.traces.explain import analyze

    path = tmp_path / "ages.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "volta_sgemm_128x64_nn", "pid": 0, "tid": 7,
         "ts": 1e308, "dur": 10, "args": {"stream": 7, "device": 0}},
        {"ph": "X", "cat": "kernel", "name": "elementwise_kernel", "pid": 0, "tid": 7,
         "ts": 100, "dur": 5, "args": {"stream": 7, "device": 0}}]}))
    result = analyze(str(path))
    assert result["bad_duration_events"] == 1
    assert result["accounting"]["window_us"] == pytest.approx(5.0)
    text = json.dumps(result)
    assert "Infinity" not in text and "NaN" not in text


def test_cli_deep_nesting_is_a_one_line_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"traceEvents": [{"args": ' + "[" * 200_000 + "]" * 200_000 + "}]}")
    result = _engine("kernels", str(path))
    assert result.returncode == 2
    assert "nested too deeply" in result.stderr and "RecursionError" not in result.stderr


def test_cli_amd_trace_prints_no_compute_capability(tmp_path):
    path = tmp_path / "rocm.json"
    path.write_text(json.dumps({
        "deviceProperties": [{"id": 0, "name": "AMD Instinct MI300X", "computeMajor": 9,
                              "computeMinor": 4, "gcnArchName": "gfx942:sramecc+:xnack-"}],
        "traceEvents": [{"ph": "X", "cat": "kernel", "pid": 0, "tid": 1, "ts": 0, "dur": 5,
                         "name": "Cijk_Ailk_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_ISA942",
                         "args": {"stream": 1, "device": 0}}]}))
    result = _engine("kernels", str(path))
    assert result.returncode == 0, result.stderr
    assert "Device: AMD Instinct MI300X (AMD gfx942)" in result.stdout
    assert "compute capability" not in result.stdout
    assert "Matrix Cores (AMD MFMA): yes" in result.stdout


def test_the_sentence_names_the_parts_that_moved_the_step():
    """H100 BERT against H100 Qwen: the step is 10.6x slower because elementwise, matrix and
    copies grew, not because idle (93 % of A, barely changed) did: parts are ordered by the
    time they added or saved, not by their share of A."""
    diff = explain_diff(TRACES / "h100_bert_small_tracelens.json.gz",
                        TRACES / "h100_qwen_tracelens.json.gz")
    sentence = diff["sentence"]
    assert sentence.startswith("Elementwise 1 % of the bf16 (A) step, 599.2x slower in bf16 (B)")
    assert sentence.index("matrix") < sentence.index("idle")
    assert sentence.endswith("-> step 10.6x slower")
    elementwise = next(r for r in diff["parts"] if r["part"] == "elementwise")
    assert 0 < elementwise["speedup"] < 0.01  # kept, not rounded to 0.0
