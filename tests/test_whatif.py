"""What-if from a measured step (Amdahl): the step if its matrix work ran at another rate,
the rest unchanged; on the real GPU traces, checked against an independent computation
from the trace's own time accounting."""

from __future__ import annotations

import io
import json
import contextlib
from pathlib import Path

import pytest

from engine.analysis.explain import analyze
from engine.analysis.whatif import ASSUMPTION, project_step, projection
from engine.hardware.gpus import DATASHEET_TFLOPS

TRACES = Path(__file__).resolve().parent / "data" / "traces"
H100_BERT = TRACES / "h100_bert_small_tracelens.json.gz"
V100_RESNET = TRACES / "v100_resnet50_kineto_v1.json.gz"


@pytest.fixture(scope="module")
def h100():
    return analyze(H100_BERT)


def _independent(result, factor):
    """step - matrix + matrix x factor, from the parts as the accounting lists them."""
    parts = result["accounting"]["parts_per_step_us"]
    matrix = parts["matrix"] + parts["attention"]
    step = result["accounting"]["step_time_us"]
    return step - matrix + matrix * factor, (step - matrix) / step


def test_an_h100_bf16_step_projected_to_fp8_and_fp32_on_the_same_gpu(h100):
    assert h100["matrix_dtype"] == "bf16"
    result = projection(h100)
    assert result["current"] == {"dtype": "bf16", "flops_per_s": 989e12,
                                 "device": "NVIDIA H100 80GB HBM3",
                                 "basis": "the H100 SXM datasheet"}
    assert result["assumes"] == ASSUMPTION
    by_target = {t["target"]: t for t in result["targets"]}
    fp8 = by_target["fp8 on this device"]
    expected_us, untouched = _independent(h100, 989 / 1979)
    assert fp8["projected_step_us"] == pytest.approx(expected_us, rel=1e-9)
    assert fp8["untouched_share"] == pytest.approx(untouched, rel=1e-9)
    assert fp8["speedup"] > 1.0 and fp8["words"].startswith("Projection, fp8 on this device:")
    fp32 = by_target["fp32 on this device"]
    assert fp32["projected_step_us"] == pytest.approx(_independent(h100, 989 / 67)[0], rel=1e-9)
    assert "slower" in fp32["words"] and "no precision change touches" in fp32["words"]


def test_other_gpus_are_projected_at_the_same_dtype_and_said_to_be_matrix_only(h100):
    targets = [t for t in projection(h100)["targets"] if t["kind"] == "gpu"]
    rows_with_bf16 = {row for row, f in DATASHEET_TFLOPS.items() if f["bf16"]} - {"H100 SXM"}
    assert {t["target"] for t in targets} == {f"bf16 on {row}" for row in rows_with_bf16}
    b200 = next(t for t in targets if t["target"] == "bf16 on B200")
    assert b200["projected_step_us"] == pytest.approx(_independent(h100, 989 / 2250)[0])
    assert all("another GPU's matrix rate only" in t["basis"] for t in targets)


def test_a_gpu_not_in_the_catalogue_has_no_projection_and_says_why():
    result = projection(analyze(V100_RESNET))
    assert "Tesla V100-DGXS-32GB" in result["none"] and "not known" in result["none"]


def test_a_cpu_step_is_projected_with_this_cpus_measured_rates():
    accounting = {"kind": "cpu", "step_time_us": 10_000.0,
                  "parts_per_step_us": {"matrix": 6_000.0, "attention": 0.0,
                                        "elementwise": 3_000.0, "optimizer": 1_000.0,
                                        "idle": 0.0}}
    result = projection({"accounting": accounting, "matrix_dtype": "fp32", "device": "cpu"},
                        measured_rates={"fp32": 100e9, "bf16": 200e9})
    (bf16,) = result["targets"]
    assert bf16["projected_step_us"] == pytest.approx(7_000.0)
    assert bf16["untouched_share"] == pytest.approx(0.4)
    assert "(elementwise, optimizer)" in bf16["words"] and "1.43x faster" in bf16["words"]
    assert projection({"accounting": accounting, "matrix_dtype": "fp32"})["none"].startswith(
        "today's fp32 matrix rate")
    assert project_step(accounting, 1.0, 1.0)["projected_step_us"] == 10_000.0


def test_engine_kernels_json_carries_the_projection():
    from engine.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["kernels", str(H100_BERT), "--json"]) == 0
    result = json.loads(out.getvalue())
    assert result["projection"]["current"]["dtype"] == "bf16"
    assert any(t["target"] == "fp8 on this device" for t in result["projection"]["targets"])
