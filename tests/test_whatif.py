"""What-if from a measured step (Amdahl): the step if its matrix work ran at another rate,
the rest unchanged; on the real GPU traces, checked against an independent computation
from the trace's own time accounting."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from engine.analysis.whatif import ASSUMPTION, project_step, projection
from engine.config import RunConfig
from engine.hardware.gpus import DATASHEET_TFLOPS
from engine.traces.explain import analyze

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


def _gpu_run_from_trace(store, result):
    """A run record as a trainer leaves it after its profiler window (summary "explain")."""
    from engine.config import RunConfig

    run_id = store.create_run(RunConfig(model="gpt", size="tiny", precision="bf16-amp"),
                              "cuda:0", "NVIDIA H100 80GB HBM3")
    accounting = result["accounting"]
    store.merge_summary(run_id, {"compute_dtype": "bf16", "explain": {
        "matrix_dtype": result["matrix_dtype"],
        "accounting": {k: accounting[k] for k in ("kind", "step_time_us", "parts_per_step_us")}}})
    store.set_status(run_id, "finished", "finished after 10 steps")
    return run_id


def test_a_runs_stored_window_projects_as_its_trace_does(store, h100):
    from engine.analysis.whatif import summary_projection

    run = store.get_run(_gpu_run_from_trace(store, h100))
    from_summary, from_trace = summary_projection(run), projection(h100)
    assert [t["projected_step_us"] for t in from_summary["targets"]] == pytest.approx(
        [t["projected_step_us"] for t in from_trace["targets"]])
    cpu_id = store.create_run(RunConfig(model="mlp"), "cpu")
    store.merge_summary(cpu_id, {"compute_dtype": "fp32", "matmul_rates": {"fp32": 1e11,
                                                                          "bf16": 2e11},
                                 "explain": {"accounting": {
                                     "kind": "cpu", "step_time_us": 100.0,
                                     "parts_per_step_us": {"matrix": 50.0, "idle": 50.0}}}})
    (bf16,) = summary_projection(store.get_run(cpu_id))["targets"]
    assert bf16["projected_step_us"] == pytest.approx(75.0)  # the rates the trainer stored
    assert "no analysed profiler window" in summary_projection(
        store.get_run(store.create_run(RunConfig(), "cpu")))["none"]


def test_live_and_compare_show_the_projection(store, h100, monkeypatch):
    from streamlit.testing.v1 import AppTest

    run_id = _gpu_run_from_trace(store, h100)
    monkeypatch.setenv("PRECISION_LAB_HOME", str(store.home))
    app = str(Path(__file__).resolve().parent.parent / "app.py")
    for page, query in (("pages/live.py", {"run": run_id}),
                        ("pages/compare.py", {"runs": run_id})):
        at = AppTest.from_file(app, default_timeout=90)
        at.run()
        for key, value in query.items():
            at.query_params[key] = value
        at.switch_page(page).run()
        assert not at.exception, (page, at.exception)
        tables = [frame.value for frame in at.dataframe if "what if" in frame.value.columns]
        assert tables and "fp8 on this device" in set(tables[0]["what if"]), page
        assert any("a projection, not a measurement" in c.value for c in at.caption), page
