"""Every page through Streamlit's AppTest, against a real store and real worker processes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.config import RunConfig
from engine.run.launcher import stop
from engine.schema import FINAL_STATUSES
from engine.store import Store
from tests.chart_support import charts_by_title

APP = str(Path(__file__).resolve().parent.parent / "app.py")
PAGES = ["pages/launch.py", "pages/live.py", "pages/runs.py"]


@pytest.fixture
def lab_home(tmp_path, monkeypatch):
    home = tmp_path / "lab"
    monkeypatch.setenv("PRECISION_LAB_HOME", str(home))
    return home


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    return at


def _chart_specs(at: AppTest) -> dict[str, dict]:
    specs = {}
    specs.update(charts_by_title(at))
    return specs


def _wait_until(at: AppTest, predicate, timeout_s: float = 60.0, poll_s: float = 1.0):
    """AppTest does not fire run_every by itself: rerun the script as the timer would."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        at.run()
        assert not at.exception, at.exception
        if predicate(at):
            return
        time.sleep(poll_s)
    raise AssertionError("condition not reached in time")


def _wait_final(store: Store, run_id: str, timeout_s: float = 120.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = store.get_run(run_id).status
        if status in FINAL_STATUSES:
            return status
        time.sleep(0.3)
    raise AssertionError(f"run {run_id} did not end")


def test_every_page_loads_on_an_empty_store(lab_home):
    at = _app()
    assert at.title[0].value == "Launch a run"
    for page in PAGES[1:]:
        at.switch_page(page).run()
        assert not at.exception, (page, at.exception)
    # Empty store: Live and Runs say so instead of drawing empty charts.
    assert any("No runs yet" in info.value for info in at.info)


def test_device_card_lists_the_cpu_and_every_mode(lab_home):
    at = _app()
    sidebar_text = " ".join(md.value for md in at.sidebar.markdown)
    assert "`cpu`" in sidebar_text
    for mode in ("fp32", "tf32", "fp16-amp", "bf16-amp", "bf16-pure", "fp8"):
        assert f"**{mode}**" in sidebar_text


def test_unsupported_mode_is_disabled_with_the_reason(lab_home):
    at = _app()
    at.selectbox(key="device").set_value("cpu")
    at.selectbox(key="precision").set_value("tf32").run()
    assert at.button(key="launch").disabled
    assert any("tf32" in err.value and "NVIDIA" in err.value for err in at.error)
    assert Store(lab_home).list_runs() == []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_launch_a_tiny_run_and_watch_the_live_chart_grow(lab_home):
    at = _app()
    at.selectbox(key="model").set_value("gpt")
    at.selectbox(key="size").set_value("tiny")
    at.selectbox(key="precision").set_value("bf16-amp")
    at.text_input(key="batch_size").set_value("8")
    # Long enough for several 0.5 s flushes even where bf16 runs natively (~20 ms a step).
    steps = 150
    at.text_input(key="steps").set_value(str(steps))
    at.button(key="launch").click().run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Live"
    store = Store(lab_home)
    (run,) = store.list_runs()
    assert run.config.precision == "bf16-amp" and run.config.batch_size == 8

    seen_points = []

    def loss_points(app):
        spec = _chart_specs(app).get("Loss")
        seen_points.append(len(spec["data"][0]["y"]) if spec else 0)
        return spec is not None and len(spec["data"][0]["y"]) >= steps

    _wait_until(at, loss_points, timeout_s=150, poll_s=0.3)
    # Points arrived incrementally, not all at once at the end.
    assert any(0 < n < steps for n in seen_points), seen_points
    spec = _chart_specs(at)["Loss"]
    stored = store.read_metrics(run.id, max_points=None)
    assert spec["data"][0]["y"] == pytest.approx(stored["loss"].tolist())
    assert spec["data"][0]["y"][-1] < spec["data"][0]["y"][0]  # the loss fell
    assert _wait_final(store, run.id) == "finished"
    # the headline tiles read as numbers: "111,487", never "1.1149e+05" cut to "1.1149e…"
    at.run()
    tiles = {m.label: m.value for m in at.metric}
    throughput = tiles["Tokens/s"]
    assert "e+" not in throughput and float(throughput.replace(",", "")) > 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_comparison_preset_runs_fp32_fp16_bf16_in_turn(lab_home):
    at = _app()
    at.selectbox(key="model").set_value("mlp")
    at.text_input(key="steps").set_value("8")
    at.checkbox(key="profile").uncheck()
    at.button(key="preset").click().run()
    assert not at.exception, at.exception
    store = Store(lab_home)
    runs = sorted(store.list_runs(), key=lambda r: r.created_at)
    assert [r.config.precision for r in runs] == ["fp32", "fp16-amp", "bf16-amp"]
    assert all(r.config.model == "mlp" for r in runs)
    for run in runs:
        assert _wait_final(store, run.id) == "finished"
    ends = [store.get_run(r.id) for r in runs]
    # One at a time, in order: each started after the previous one ended.
    for earlier, later in zip(ends, ends[1:]):
        assert later.started_at >= earlier.ended_at - 0.05


def test_runs_page_filters_and_opens_a_run_in_live(lab_home):
    store = Store(lab_home)
    finished = store.create_run(RunConfig(model="mlp", precision="fp32"), "cpu", "test cpu")
    store.set_status(finished, "running")
    store.merge_summary(finished, {"samples_per_s": 1234.5, "final_loss": 0.5,
                                   "peak_mem_bytes": 2**30})
    store.set_status(finished, "finished")
    failed = store.create_run(RunConfig(model="gpt", precision="bf16-amp"), "cpu", "test cpu")
    store.set_status(failed, "failed", "worker exited with signal 9 (SIGKILL) at step 3")
    store.update_run(failed, pid=None)

    at = _app()
    at.switch_page("pages/runs.py").run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert set(table["run_id"]) == {finished, failed}
    at.multiselect(key="runs_status").set_value(["failed"]).run()
    assert list(at.dataframe[0].value["run_id"]) == [failed]
    at.multiselect(key="runs_status").set_value([]).run()
    at.multiselect(key="runs_precision").set_value(["fp32"]).run()
    assert list(at.dataframe[0].value["run_id"]) == [finished]

    # The failed run's reason is shown on its Live page.
    at.session_state["live_run_id"] = failed
    at.switch_page("pages/live.py").run()
    assert any("signal 9" in err.value for err in at.error)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_stop_button_stops_a_running_run(lab_home):
    from engine.run.launcher import launch

    store = Store(lab_home)
    run_id = launch(RunConfig(model="mlp", steps=100000, profile=False, device="cpu"), store)
    deadline = time.monotonic() + 60
    while store.metrics_count(run_id) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        at = _app()
        at.session_state["live_run_id"] = run_id
        at.switch_page("pages/live.py").run()
        at.button(key="stop_run").click().run()
        assert not at.exception, at.exception
        assert store.get_run(run_id).status == "stopped"
        assert store.metrics_count(run_id) > 0  # metrics kept
    finally:
        stop(run_id, store)


def test_fp8_is_refused_on_cpu_with_the_reason_and_the_size_advice(lab_home):
    at = _app()
    at.selectbox(key="device").set_value("cpu")
    at.selectbox(key="precision").set_value("fp8").run()
    assert at.button(key="launch").disabled
    assert any("sm89" in err.value for err in at.error)
    # The device's verdict first; the GEMM-size advice only as a note for a GPU, after it.
    assert not any("fp8 may not pay here" in w.value for w in at.warning)
    assert any("On an fp8-capable GPU, fp8 may not pay here" in c.value for c in at.caption)


# Run in a process of its own: the test session has long imported pandas and plotly's
# graph objects, and the question is what a new server's first page imports.
_FIRST_PAGE_IMPORTS = """
import sys
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(sys.argv[1], default_timeout=60)
at.run()
assert not at.exception, at.exception
assert any(button.label == "Launch run" for button in at.button)
print(" ".join(name for name in ("pandas", "pyarrow", "engine.report.figures")
               if name in sys.modules) or "none")
"""


@pytest.mark.slow
def test_first_page_imports_no_pandas(tmp_path):
    """Launch, a new server's usual first page, draws without importing pandas (and with it
    pyarrow) or the chart module: on a 2-core machine those imports were 0.5-0.9 s of the
    first page's script run (bench.pages_browser). Its mode table is built only when opened."""
    import subprocess
    import sys

    from bench._common import subprocess_env

    done = subprocess.run([sys.executable, "-c", _FIRST_PAGE_IMPORTS, APP],
                          env=subprocess_env(tmp_path / "lab"), capture_output=True,
                          text=True, timeout=120, cwd=str(Path(APP).parent))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["none"], done.stdout


@pytest.mark.parametrize("typed, shown", [("1e9", "1e9"), ("3.7", "3.7"), ("", "(empty)"),
                                          ("70000", "70000"), ("16; rm -rf /", "16; rm -rf /"),
                                          ("**8**", "**8**")])
def test_launch_refuses_a_batch_size_that_is_not_a_whole_number_in_range(lab_home, typed, shown):
    """A browser's number input turned "1e9" into 1 and "3.7" into 3 without a word: the
    field is named with the value and the range in plain digits, and nothing launches."""
    at = _app()
    at.text_input(key="batch_size").set_value(typed).run()
    assert not at.exception, at.exception
    errors = [e.value.replace("\\", "") for e in at.error]  # Markdown escapes: text shown
    assert f"Batch size: {shown} is not a whole number from 1 to 65,536" in errors, errors
    assert at.button(key="launch").disabled
    assert Store(lab_home).list_runs() == []


def test_launch_reads_digits_with_separators_and_ranges_in_plain_digits(lab_home):
    at = _app()
    at.text_input(key="steps").set_value("1,000").run()
    assert not at.exception and not at.error
    at.text_input(key="steps").set_value("0").run()
    assert "Steps: 0 is not a whole number from 1 to 1,000,000" in [
        e.value.replace("\\", "") for e in at.error]
    assert all("e+" not in (w.help or "") for w in at.text_input)
