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
from tests.chart_support import chart_specs

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


# The page's details (pages/ui.details): drawn only while open.
DETAILS = ("kernels_full_names", "kernels_step_comm", "kernels_why", "kernels_could_table",
           "kernels_per_op", "kernels_rank_files")


def _kernels_page(run_id: str, open_details: bool = True) -> AppTest:
    """The Kernels page of this run, with every detail opened (as a person clicking each
    one), or with none."""
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["live_run_id"] = run_id
    for key in DETAILS if open_details else ():
        at.session_state[key] = True
    at.run()
    at.switch_page("pages/kernels.py").run()
    assert not at.exception, at.exception
    return at


def test_h100_run_shows_tensor_core_verdict_with_kernel_evidence(store):
    run_id = _gpu_run(store, "h100_bert_small_tracelens.json.gz", "bf16-amp")
    at = _kernels_page(run_id)
    banner = at.success[0].value
    assert "Tensor Cores: yes" in banner and "bf16" in banner
    # Kernel names come from the trace: shown as text, never as Markdown.
    evidence = " ".join(text.value for text in at.text)
    assert "tensorop_bf16_s16816gemm" in evidence
    top = at.dataframe[0].value
    assert top.iloc[0]["tensor_core"] == "yes"
    titles = [spec["layout"]["title"]["text"] for spec in chart_specs(at)]
    assert titles[0].startswith("GPU time per kernel category")
    assert titles[1].startswith("Per-op rates against the roofline (H100 SXM")
    # The stored kernel table matches the analysis the page shows.
    stored = store.read_kernels(run_id)
    assert stored["total_us"].sum() == pytest.approx(307.197, abs=0.01)
    # The Live page carries the badge once the window is analysed.
    at.switch_page("pages/live.py").run()
    assert any("Tensor Cores: yes" in md.value for md in at.markdown)


def test_closed_details_are_not_drawn_until_opened(store):
    run_id = _gpu_run(store, "a100_conv_nccl_hta.json.gz", "tf32")
    closed = _kernels_page(run_id, open_details=False)
    opened = _kernels_page(run_id)
    labels = [expander.label for expander in closed.expander]
    assert "Per CPU op" in labels and "Full kernel names" in labels
    # closed: the expanders are there, their tables and code are not
    assert len(closed.dataframe) < len(opened.dataframe)
    assert len(closed.text) == 1 and len(opened.text) == 1  # the evidence list
    assert not closed.code and len(opened.code) == 1  # the full names: drawn when opened
    def per_op(at):
        return [df.value for df in at.dataframe if "cpu_op" in df.value.columns]

    assert not per_op(closed) and per_op(opened)


def test_pascal_run_says_no_tensor_cores_and_why(store):
    run_id = _gpu_run(store, "gp100_pascal_hta.json.gz", "fp16-amp")
    at = _kernels_page(run_id)
    assert at.error and "Tensor Cores: no" in at.error[0].value
    assert "GP100 has no Tensor Cores" in at.error[0].value
    # Top kernels, its "why" table (expander), then "could have, didn't" as a table
    # (expander) under one sentence per op: the cause on screen at any width.
    top, why, could = (at.dataframe[i].value for i in range(3))
    assert list(top.columns[:4]) == ["kernel", "time_ms", "count", "tensor_core"]
    assert "why" in why.columns
    assert list(could.columns[:2]) == ["cpu_op", "likely_causes"]
    assert any("no Tensor Core hardware" in causes for causes in could["likely_causes"])
    assert all(share.endswith("%") for share in could["share_of_its_matrix_time"])
    sentences = [m.value for m in at.markdown if "without Tensor Cores (" in m.value]
    assert len(sentences) == len(could)
    assert any("no Tensor Core hardware" in s for s in sentences)


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


def test_gpu_run_banner_carries_the_advice_and_the_accounting_is_shown(store):
    run_id = _gpu_run(store, "a100_conv_nccl_hta.json.gz", "tf32")
    at = _kernels_page(run_id)
    banner = at.success[0].value.replace("\\", "")  # as shown: the escapes are not drawn
    assert "but the GPU was idle 76 % of the step" in banner
    assert "CPU/launch-bound" in banner and "CUDA graphs" in banner
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["GPU busy"] == "157.500 ms" and metrics["GPU idle"] == "509.726 ms"
    assert metrics["Communication hidden under compute"] == "7.317 ms"
    frames = [df.value for df in at.dataframe]
    steps = next(f for f in frames if "launched_busy_ms" in f.columns)
    assert list(steps["step"]) == [4, 5, 6]
    comm = next(f for f in frames if "hidden_under_compute_ms" in f.columns)
    assert list(comm["step"]) == [4, 5, 6]
    streams = next(f for f in frames if "stream" in f.columns and "busy_ms" in f.columns)
    assert list(streams["stream"]) == ["7", "40"]
    # the shares read as the CLI prints them: one rounding, one formatter
    from engine.cli.kernels import format_breakdown
    from engine.traces.accounting import launch_words
    from engine.traces.explain import analyze

    report = format_breakdown(analyze(TRACES / "a100_conv_nccl_hta.json.gz"))
    parts = next(f for f in frames if "share_of_step" in f.columns)
    for part, share in zip(parts["part"], parts["share_of_step"]):
        assert any(line.split()[:1] == [part] and line.endswith(share)
                   for line in report.splitlines()), (part, share)
    assert all(str(v).endswith("%") for v in streams["busy"])
    assert list(steps.columns) == ["step", "time_ms", "busy_ms", "idle", "gpu_span_ms",
                                   "launched_busy_ms", "idle_in_gpu_span", "lag_ms"]
    assert list(comm.columns) == ["step", "communication_ms", "hidden_under_compute_ms",
                                  "copy_ms"]  # no dict columns
    # the GPU span and by-launch sentences, the same words as the CLI's
    for sentence in launch_words(analyze(TRACES / "a100_conv_nccl_hta.json.gz")["accounting"]):
        assert any(sentence == caption.value for caption in at.caption), sentence
        assert sentence in report
    # evidence: short names in the list, the full (template) names on the expander
    short, full = at.text[0].value, at.code[0].value
    assert short and "(" not in short  # no argument lists in the list
    for line in short.splitlines():
        assert line.split("<")[0] in full


def test_cpu_run_shows_its_own_breakdown_and_two_runs_compare(store):
    from _real_runs import record_run, tiny_config

    fp32 = record_run(store, tiny_config("fp32", profile=True, steps=8, warmup_steps=2))
    bf16 = record_run(store, tiny_config("bf16-amp", profile=True, steps=8, warmup_steps=2))
    at = _kernels_page(fp32)
    text = " ".join(box.value for box in at.info).replace("\\", "")
    assert "CPU run: " in text and "cuBLAS" not in text and "Tensor Cores" not in text
    labels = [m.label for m in at.metric]
    assert "Casts (dtype conversions)" in labels
    parts = next(df.value for df in at.dataframe if "time_ms_per_step" in df.value.columns)
    assert "idle" in list(parts["part"])
    ops = next(df.value for df in at.dataframe if "cpu_op" in df.value.columns
               and "self_ms" in df.value.columns)
    assert not any(column.endswith("_us") for column in ops.columns)  # ms, like the rest
    at.selectbox(key="kernels_compare_run").set_value(bf16).run()
    assert not at.exception, at.exception
    assert any("-> step" in box.value.replace("\\", "") for box in at.info)
    diff = next(df.value for df in at.dataframe if "share of A's step" in df.value.columns)
    assert list(diff["part"])[0] == "matrix" and list(diff["part"])[-1] == "step"
    assert all(str(share).endswith("%") for share in diff["share of A's step"])
    # the same comparison as Compare's: it says it covers the profiled steps only
    assert any("From the profiled steps only" in c.value for c in at.caption)
    labels = [m.label for m in at.metric]
    assert "B against A (profiled steps)" in labels
    assert any(label.startswith("Step, A (") and "fp32" in label for label in labels)


def test_one_profiler_step_can_be_picked_and_the_figures_follow(store):
    """The A100 NCCL trace has ProfilerStep#4..6: picking one shows that step's figures
    (the window's divided differently), and the whole window comes back."""
    run_id = _gpu_run(store, "a100_conv_nccl_hta.json.gz", "tf32")
    at = _kernels_page(run_id)
    whole = {m.label: m.value for m in at.metric}
    picker = at.selectbox(key="kernels_step")
    assert picker.options[0].startswith("the whole window")
    picker.set_value(5).run()
    assert not at.exception, at.exception
    one = {m.label: m.value for m in at.metric}
    assert one["GPU busy"] != whole["GPU busy"]
    busy_ms = float(one["GPU busy"].split()[0])
    assert 0 < busy_ms < float(whole["GPU busy"].split()[0])
    # the Tensor-Core breakdown follows the step too, and says which kernels it covers
    assert one["Kernel time (summed)"] == "50.73 ms" != whole["Kernel time (summed)"]
    assert any("cover the kernels of ProfilerStep#5" in c.value for c in at.caption)
    at.selectbox(key="kernels_step").set_value(None).run()
    assert {m.label: m.value for m in at.metric} == whole


# --- per-op rates, the roofline and the rates' witness; traces of other kinds ---------

def _text(element) -> str:
    """An element's text as a person reads it: Markdown escapes removed."""
    return element.value.replace("\\", "")


def test_mi300x_run_shows_matrix_cores_yes_and_its_per_op_rates(store):
    at = _kernels_page(_gpu_run(store, "mi300_qwen_tracelens.json.gz", "bf16-amp"), False)
    assert any("Matrix Cores (AMD MFMA): yes" in _text(box) for box in at.success)
    assert any(
        _text(box).startswith("The rates confirm the kernel names: aten::mm 8944x1024x2816 bf16")
        for box in at.success
    )
    table = next(frame.value for frame in at.dataframe if "TFLOP/s" in frame.value.columns)
    big = table[table["shape"] == "8944x2816x1024"].iloc[0]
    assert big["op"] == "aten::mm" and big["calls"] == 48 and big["bound"] == "compute"
    assert 455 < big["TFLOP/s"] < 480  # TraceLens: 466.82
    assert any("roofline" in str(spec.get("layout", {}).get("title", ""))
               for spec in chart_specs(at))


def test_a_trace_without_shapes_says_how_to_record_them(store):
    at = _kernels_page(_gpu_run(store, "gp100_pascal_hta.json.gz", "bf16-amp"), False)
    assert any("record_shapes=True" in _text(caption) for caption in at.caption)


@pytest.mark.parametrize("name, words", [
    ("a100_cupti_range_profiler_hta.json.gz", "Tensor Cores (from SASS counters): partly"),
    ("mtia_single_rank_hta.json.gz", "A Meta MTIA trace")], ids=["range", "mtia"])
def test_traces_of_other_kinds_are_named_never_a_cpu_run(store, name, words):
    at = _kernels_page(_gpu_run(store, f"other_kinds/{name}", "bf16-amp"), False)
    shown = " ".join(_text(box) for box in [*at.success, *at.warning, *at.info, *at.error])
    assert words in shown and "CPU run" not in shown.replace("not a CPU run", "")
    assert "CUPTI probably failed" not in shown
    if name.startswith("a100_cupti"):  # the counters per matrix kernel, as a table
        table = next(f.value for f in at.dataframe if "counters say" in f.value.columns)
        assert set(table["counters say"]) == {"yes", "no"}
