"""Kernels page via AppTest: per-op rates, the roofline and the rates' witness on a real
MI300X trace, and traces of other kinds (range profiler, MTIA) named for what they are."""

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


def _run_with_trace(store: Store, trace: Path) -> str:
    run_id = store.create_run(RunConfig(precision="bf16-amp", model="gpt"), "cuda:0",
                              "recorded GPU")
    target = store.run_dir(run_id) / TRACE_FILENAME
    shutil.copy(trace, target)
    analyze_window(store, run_id, "cuda:0", target, None, "bf16")
    store.set_status(run_id, "finished")
    return run_id


def _text(element) -> str:
    """An element's text as a person reads it: Markdown escapes removed."""
    return element.value.replace("\\", "")


def _page(run_id: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["live_run_id"] = run_id
    at.run()
    at.switch_page("pages/kernels.py").run()
    assert not at.exception, at.exception
    return at


def test_mi300x_run_shows_matrix_cores_yes_and_its_per_op_rates(store):
    at = _page(_run_with_trace(store, TRACES / "mi300_qwen_tracelens.json.gz"))
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
    at = _page(_run_with_trace(store, TRACES / "gp100_pascal_hta.json.gz"))
    assert any("record_shapes=True" in _text(caption) for caption in at.caption)


@pytest.mark.parametrize("name, words", [
    ("a100_cupti_range_profiler_hta.json.gz", "Tensor Cores (from SASS counters): partly"),
    ("mtia_single_rank_hta.json.gz", "A Meta MTIA trace")], ids=["range", "mtia"])
def test_traces_of_other_kinds_are_named_never_a_cpu_run(store, name, words):
    at = _page(_run_with_trace(store, TRACES / "other_kinds" / name))
    shown = " ".join(_text(box) for box in [*at.success, *at.warning, *at.info, *at.error])
    assert words in shown and "CPU run" not in shown.replace("not a CPU run", "")
    assert "CUPTI probably failed" not in shown
    if name.startswith("a100_cupti"):  # the counters per matrix kernel, as a table
        table = next(f.value for f in at.dataframe if "counters say" in f.value.columns)
        assert set(table["counters say"]) == {"yes", "no"}
