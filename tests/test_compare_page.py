"""The Compare page through Streamlit's AppTest, on real tiny CPU runs in a private store."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from _real_runs import record_run, speed_word, tiny_config
from streamlit.testing.v1 import AppTest

from engine.analysis.compare import summary_table
from engine.analysis.findings import findings
from engine.analysis.summary_text import MAIN_COLUMNS, summary_strings
from engine.schema import NUMERICS_FILENAME
from engine.store import Store
from engine.training.numerics import NumericsProbe
from tests.chart_support import chart_specs

APP = str(Path(__file__).resolve().parent.parent / "app.py")


@pytest.fixture
def lab(home):
    """fp32, fp16-amp and bf16-amp runs of one tiny MLP, stored as the preset would."""
    store = Store(home)
    ids = [record_run(store, tiny_config(p, steps=8)) for p in ("fp32", "fp16-amp", "bf16-amp")]
    return store, ids


def _compare_page(preset_ids=None, every_column: bool = True) -> AppTest:
    """The Compare page, with its "Every summary column" details opened unless told."""
    at = AppTest.from_file(APP, default_timeout=90)
    at.session_state["compare_every_column"] = every_column
    at.run()
    if preset_ids is not None:
        at.session_state["preset_run_ids"] = preset_ids
    at.switch_page("pages/compare.py").run()
    assert not at.exception, at.exception
    return at


def _values(data) -> list:
    """A trace's values: plotly sends numpy arrays as base64 typed arrays ("bdata")."""
    if isinstance(data, dict) and "bdata" in data:
        return np.frombuffer(base64.b64decode(data["bdata"]), dtype=data["dtype"]).tolist()
    return list(data)


def _charts(at: AppTest) -> dict[str, dict]:
    specs = chart_specs(at)
    return {spec["layout"]["title"]["text"].split(" (")[0].split(":")[0]: spec for spec in specs}


@pytest.mark.slow
def test_every_summary_column_is_sent_only_when_opened(lab):
    """pages/ui.details: closed, the wide table is neither built nor drawn (each table
    costs the browser before the page is ready); the main one is there."""
    store, ids = lab
    at = _compare_page(preset_ids=ids, every_column=False)
    assert "Every summary column" in [expander.label for expander in at.expander]
    columns = [list(frame.value.columns) for frame in at.dataframe]
    assert columns[0][:3] == ["run", "throughput x", "95 % interval"]
    assert not any("run id" in names for names in columns)  # the full table's first column


@pytest.mark.slow
def test_compare_page_draws_the_preset_with_the_engines_numbers(lab):
    store, ids = lab
    at = _compare_page(preset_ids=ids)
    assert at.title[0].value == "Compare runs"
    assert at.multiselect(key="compare_runs").value == ids

    charts = _charts(at)
    assert {"Loss", "Throughput", "Peak memory"} <= set(charts)
    loss = charts["Loss"]["data"]
    assert [trace["name"] for trace in loss] == ["fp32", "fp16-amp", "bf16-amp"]
    for trace, run_id in zip(loss, ids):
        assert _values(trace["y"]) == pytest.approx(store.read_metrics(run_id)["loss"].tolist())

    expected = summary_table(store, ids)
    # The summary comes first: the columns that fit 1280 px, then every column (expander),
    # in the strings the report prints (engine.analysis.summary_text).
    main, every = at.dataframe[0].value, at.dataframe[1].value
    assert list(every["run id"]) == ids
    assert every.to_dict("list") == summary_strings(expected).to_dict("list")
    assert main.to_dict("list") == summary_strings(expected, MAIN_COLUMNS).to_dict("list")
    assert list(main.columns)[:3] == ["run", "throughput x", "95 % interval"]
    assert "None" not in every.to_numpy().tolist() and "nan" not in every.to_numpy().tolist()

    # The page escapes markdown characters; unescaped, every finding is there verbatim.
    text = re.sub(r"\\(.)", r"\1", "\n".join(md.value for md in at.markdown))
    for statement in findings(expected, [store.get_run(i) for i in ids]):
        assert f"- {statement}" in text
    by_id = expected.set_index("run_id")
    assert speed_word(by_id.loc[ids[1]], by_id.loc[ids[0]]) in text

    (button,) = at.get("download_button")
    assert button.label == "Download HTML report"
    # No run recorded numerics: the page says how to get them and offers the demo.
    assert any("recorded numerics" in info.value for info in at.info)
    assert at.button(key="demo_numerics").label.startswith("Launch demo")


@pytest.mark.slow
def test_smoothing_wall_time_and_log_scale_controls(lab):
    _store, ids = lab
    at = _compare_page(preset_ids=ids)
    at.slider(key="compare_smoothing").set_value(0.6).run()
    loss = _charts(at)["Loss"]
    # Raw points stay, faint, under each smoothed line.
    assert [t["mode"] for t in loss["data"]] == ["markers", "lines"] * 3
    assert all(t["opacity"] < 1 for t in loss["data"] if t["mode"] == "markers")
    at.radio(key="compare_x").set_value("wall_time_s").run()
    at.toggle(key="compare_log").set_value(True).run()
    assert not at.exception, at.exception
    loss = _charts(at)["Loss"]
    assert loss["layout"]["xaxis"]["title"]["text"].startswith("wall time")
    assert loss["layout"]["yaxis"]["type"] == "log"

    # Another baseline: the table follows it.
    at.selectbox(key="compare_baseline").set_value(ids[2]).run()
    shown = at.dataframe[1].value.set_index("run id")
    assert shown.loc[ids[2], "throughput x"] == "1.00x"


@pytest.mark.slow
def test_default_selection_without_a_preset_and_config_diff(lab):
    store, ids = lab
    at = _compare_page()
    assert at.multiselect(key="compare_runs").value == ids  # newest finished group
    diff = at.dataframe[2].value  # after the summary's two tables
    assert list(diff["field"]) == ["precision"]


@pytest.mark.slow
def test_numerics_view_for_a_run_with_numerics(lab):
    from engine.training.loop import Trainer, compute_loss
    from engine.training.precision import cast_inputs

    store, ids = lab
    # Record numerics of a real tiny model into the fp16 run's directory.
    trainer = Trainer(tiny_config("fp16-amp"), torch.device("cpu"))
    probe = NumericsProbe({1}).register(trainer.model)
    probe.begin_step(1, loss_scale=65536.0)
    inputs, targets = trainer.task.batch()
    with trainer.plan.autocast():
        logits = trainer.model(cast_inputs(inputs, trainer.plan))
    (compute_loss(trainer.cfg, logits, targets) * 65536.0).backward()
    probe.capture_gradients(1, trainer.model, grads_scaled=True)
    probe.save(store.run_dir(ids[1]) / NUMERICS_FILENAME)

    at = _compare_page(preset_ids=ids)
    assert at.selectbox(key="numerics_run").value == ids[1]
    hist = chart_specs(at)[-1]
    assert "step 1" in hist["layout"]["title"]["text"]
    assert [t["name"] for t in hist["data"]] == ["net.0", "net.2", "net.4"]
    table = at.dataframe[-1].value
    assert set(table["kind"]) == {"output_grad"} and len(table) == 3
    assert table["underflow_fp16_scaled_pct"].notna().all()
    at.radio(key="numerics_kind").set_value("activation").run()
    assert not at.exception, at.exception
    assert at.dataframe[-1].value["underflow_fp16_scaled_pct"].isna().all()


@pytest.mark.slow
def test_demo_button_queues_the_three_demo_runs(home):
    from engine.run.launcher import stop

    store = Store(home)
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    at.switch_page("pages/compare.py").run()
    assert any("No runs yet" in info.value for info in at.info)
    at.button(key="demo_empty").click().run()
    assert not at.exception, at.exception
    runs = sorted(store.list_runs(), key=lambda r: r.created_at)
    try:
        assert [(r.config.precision, r.config.loss_scaling) for r in runs] == [
            ("fp16-amp", True), ("fp16-amp", False), ("bf16-amp", True)]
        assert {(r.config.model, r.config.batch_size, r.config.lr) for r in runs} == {
            ("mlp", 512, 0.01)}
        assert at.session_state["preset_run_ids"] == [r.id for r in runs]
        assert at.multiselect(key="compare_runs").value == [r.id for r in runs]
    finally:
        for run in runs:
            stop(run.id, store)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_compare_page_on_real_worker_runs_end_to_end(home):
    """The Launch page's preset path: three profiled runs queued through the launcher,
    run by real workers one after another, then compared (findings explain a slowdown
    with the CPU evidence the profiler window recorded)."""
    import time

    from engine.run.launcher import launch
    from engine.schema import FINAL_STATUSES

    store = Store(home)
    ids = [launch(tiny_config(p, steps=12, profile=True, profile_steps=2), store)
           for p in ("fp32", "fp16-amp", "bf16-amp")]
    deadline = time.monotonic() + 200
    while not all(store.get_run(i).status in FINAL_STATUSES for i in ids):
        assert time.monotonic() < deadline, [store.get_run(i).status for i in ids]
        time.sleep(0.3)
    assert [store.get_run(i).status for i in ids] == ["finished"] * 3

    at = _compare_page(preset_ids=ids)
    expected = summary_table(store, ids).set_index("run_id")
    assert (expected["steady_rows"] == 12 - 2 - 3).all()  # warm-up and profiler window out
    text = re.sub(r"\\(.)", r"\1", "\n".join(md.value for md in at.markdown))
    for run_id in ids[1:]:
        run = store.get_run(run_id)
        line = next(row for row in text.splitlines()
                    if row.startswith(f"- {run.config.precision}:"))
        x = expected.loc[run_id, "throughput_x"]
        assert speed_word(expected.loc[run_id], expected.loc[ids[0]]) in line
        evidence = run.summary.get("cpu_evidence") or {}
        assert evidence.get("headline"), "the profiled CPU run recorded its oneDNN evidence"
        if x <= 0.95 and "emulated" in evidence.get("verdict", ""):
            assert evidence["headline"] in line
        assert "Tensor Cores" not in line  # unknown on a CPU: not mentioned


def test_page_handles_a_run_without_metrics_and_a_single_run(home):
    from _real_runs import write_rows

    store = Store(home)
    done = write_rows(store, tiny_config("fp32"), [
        {"step": s, "phase": "warmup" if s <= 2 else "steady", "loss": 2.0 - 0.1 * s,
         "step_time_ms": 10.0, "samples_per_s": 1600.0, "wall_time_s": 0.01 * s}
        for s in range(1, 9)])
    queued = store.create_run(tiny_config("bf16-amp"), "cpu", "test cpu")  # no rows yet
    at = _compare_page(preset_ids=[done, queued])
    assert at.multiselect(key="compare_runs").value == [done, queued]
    table = at.dataframe[1].value.set_index("run id")
    assert table.loc[queued, "timing basis"] == "none"
    assert table.loc[queued, "throughput x"] == "n/a"  # never "None" or "nan"
    assert table.loc[queued, "tensor peak (MiB)"] == "n/a"
    assert table.loc[queued, "process peak (MiB)"] == "n/a"
    assert any("still queued" in c.value for c in at.caption)
    at.multiselect(key="compare_runs").set_value([done]).run()
    assert not at.exception, at.exception
    assert any("nothing to compare" in c.value for c in at.caption)
    at.multiselect(key="compare_runs").set_value([]).run()
    assert any("Pick one or more runs" in info.value for info in at.info)
