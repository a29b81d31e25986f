"""Kernels page via AppTest, fed with real profiler traces from real GPUs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.config import RunConfig
from engine.run.window import analyze_window
from engine.schema import TRACE_FILENAME
from engine.store import Store

APP = str(Path(__file__).resolve().parent.parent / "app.py")
TRACES = Path(__file__).resolve().parent / "data" / "traces"


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("PRECISION_LAB_HOME", str(tmp_path / "lab"))
    return Store(tmp_path / "lab")


def _gpu_run(store: Store, trace_name: str, precision: str) -> str:
    """A finished CUDA run whose profiler window produced this real trace."""
    run_id = store.create_run(RunConfig(precision="fp32" if precision == "tf32" else precision,
                                        model="gpt"), "cuda:0", "recorded GPU")
    trace = store.run_dir(run_id) / TRACE_FILENAME
    shutil.copy(TRACES / trace_name, trace)
    analyze_window(store, run_id, "cuda:0", trace, None, "bf16")
    store.set_status(run_id, "finished")
    return run_id


def _kernels_page(run_id: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["live_run_id"] = run_id
    at.run()
    at.switch_page("pages/kernels.py").run()
    assert not at.exception, at.exception
    return at


def test_h100_run_shows_tensor_core_verdict_with_kernel_evidence(store):
    run_id = _gpu_run(store, "h100_bert_small_tracelens.json.gz", "bf16-amp")
    at = _kernels_page(run_id)
    banner = at.success[0].value
    assert "Tensor Cores: yes" in banner and "bf16" in banner
    # Kernel names come from the trace: shown as text (a code block), never as Markdown.
    evidence = " ".join([md.value for md in at.markdown] + [code.value for code in at.code])
    assert "tensorop_bf16_s16816gemm" in evidence
    top = at.dataframe[0].value
    assert top.iloc[0]["tensor_core"] == "yes"
    assert len(at.get("plotly_chart")) == 1
    # The stored kernel table matches the analysis the page shows.
    stored = store.read_kernels(run_id)
    assert stored["total_us"].sum() == pytest.approx(307.197, abs=0.01)
    # The Live page carries the badge once the window is analysed.
    at.switch_page("pages/live.py").run()
    assert any("Tensor Cores: yes" in md.value for md in at.markdown)


def test_pascal_run_says_no_tensor_cores_and_why(store):
    run_id = _gpu_run(store, "gp100_pascal_hta.json.gz", "fp16-amp")
    at = _kernels_page(run_id)
    assert at.error and "Tensor Cores: no" in at.error[0].value
    assert "GP100 has no Tensor Cores" in at.error[0].value
    could = at.dataframe[1].value
    assert any("no Tensor Core hardware" in " ".join(causes) for causes in could["likely_causes"])


def test_cuda_run_without_kernel_events_is_an_error(store, tmp_path):
    run_id = store.create_run(RunConfig(), "cuda:0", "recorded GPU")
    empty = store.run_dir(run_id) / TRACE_FILENAME
    import gzip
    import json

    with gzip.open(empty, "wt") as handle:  # CUPTI failed: CPU ops only, no kernels
        json.dump({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm",
                                    "ts": 1, "dur": 5, "pid": 1, "tid": 1}]}, handle)
    analyze_window(store, run_id, "cuda:0", empty, None, "bf16")
    at = _kernels_page(run_id)
    assert any("no GPU kernel events" in err.value for err in at.error)


def test_cpu_run_shows_the_onednn_evidence(store):
    run_id = store.create_run(RunConfig(model="resnet"), "cpu", "test cpu")
    log = store.run_dir(run_id) / "onednn_verbose.log"
    log.write_text(
        "onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx2,forward_training,"
        "src:f32:a:blocked:abcd::f0 wei:f32:a:blocked:Acdb8a::f0 dst:f32:a:blocked:aBcd8b::f0,"
        "attr-scratchpad:user,alg:convolution_direct,mb2_ic3oc8_ih16oh14kh3,0.0109\n")
    analyze_window(store, run_id, "cpu", None, log, "fp32")
    at = _kernels_page(run_id)
    assert any("CPU matrix unit" in box.value and "avx2" in box.value for box in at.info)
    assert at.dataframe[0].value.iloc[0]["implementation"] == "jit:avx2"
