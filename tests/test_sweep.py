"""Sweeps on this machine: grid validation, the results matrix, a real local sweep through
the launcher (FIFO device queue), the CLI's contract, the Sweep page, and the store and
launcher paths of Ray sweeps that need no Ray cluster (driver gone, stop while queued).

The Ray cluster itself is exercised in tests/test_ray_sweep.py.
"""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_for
from streamlit.testing.v1 import AppTest

from engine.analysis.steady import COMPARE_STATS_KEY
from engine.cli.main import main as cli_main
from engine.cluster.ray_env import RayOptions, ray_problem, validate_ray_address
from engine.cluster.sweep import (
    MAX_SWEEP_RUNS,
    RATIO_BASELINE,
    RATIO_BUSY,
    RATIO_INCONCLUSIVE,
    RATIO_SIGNIFICANT,
    SweepGrid,
    cell_hover,
    create_sweep,
    matrix_text,
    results_matrix,
    sweep_view,
    wait_sweep,
)
from engine.config import ConfigError, RunConfig
from engine.proc import process_create_time
from engine.run.launcher import reconcile, stop
from engine.schema import (
    FAILED,
    FINISHED,
    QUEUED,
    RUNNING,
    STOPPED,
    SWEEP_DONE,
    SWEEP_LOCAL,
    SWEEP_RAY,
)
from engine.store import DB_FILENAME, Store
from tests.chart_support import charts_by_title

APP = str(Path(__file__).resolve().parent.parent / "app.py")


# ---------------------------------------------------------------------------------------
# the grid


def test_grid_is_the_product_models_outermost_batch_innermost():
    grid = SweepGrid(models="gpt,mlp", precisions=("fp32", "bf16-amp"), batch_sizes="8, 16",
                     steps=7, size="tiny")
    cells = [(c.model, c.precision, c.batch_size, c.steps, c.size) for c in grid.configs()]
    assert grid.run_count == 8
    assert cells[:3] == [("gpt", "fp32", 8, 7, "tiny"), ("gpt", "fp32", 16, 7, "tiny"),
                         ("gpt", "bf16-amp", 8, 7, "tiny")]
    assert cells[-1] == ("mlp", "bf16-amp", 16, 7, "tiny")
    assert SweepGrid.from_dict(json.loads(json.dumps(grid.to_dict()))) == grid


def test_grid_drops_repeated_values():
    grid = SweepGrid(models="mlp,mlp", precisions="fp32,fp32,bf16-amp", batch_sizes="8,8")
    assert (grid.models, grid.precisions, grid.batch_sizes) == (
        ("mlp",),
        ("fp32", "bf16-amp"),
        (8,),
    )


@pytest.mark.parametrize("changes, field, value, fix_part", [
    ({"models": "gpt,bert"}, "models", "bert", "choose from mlp, resnet, gpt"),
    ({"models": ""}, "models", "", "at least one model"),
    ({"precisions": "fp64"}, "precisions", "fp64", "choose from fp32"),
    ({"batch_sizes": "8,x"}, "batch_sizes", "x", "whole number"),
    ({"batch_sizes": "0"}, "batch_sizes", "0", "[1, 65536]"),
    ({"batch_sizes": ()}, "batch_sizes", (), "at least one batch size"),
    ({"steps": 0}, "steps", 0, "out of range"),
    ({"size": "huge"}, "size", "huge", "tiny, small, medium"),
    ({"device": "tpu"}, "device", "tpu", "auto, cpu, cuda"),
])
def test_bad_grid_names_the_field_the_value_and_the_fix(changes, field, value, fix_part):
    with pytest.raises(ConfigError) as err:
        SweepGrid(**changes)
    assert (err.value.field, err.value.value) == (field, value)
    assert fix_part in err.value.fix


def test_grid_size_is_capped_with_the_arithmetic_in_the_message():
    sizes = ",".join(str(b) for b in range(1, 10))
    with pytest.raises(ConfigError) as err:
        SweepGrid(models="mlp,gpt", precisions="fp32,bf16-amp,fp16-amp", batch_sizes=sizes)
    assert err.value.field == "grid"
    assert f"= 54 runs, more than the {MAX_SWEEP_RUNS}" in err.value.fix


@pytest.mark.parametrize("address, fix_part", [
    ("ray://head:10001", "Ray Client (ray://) is not supported"),
    ("head", "HOST:PORT"),
    ("head:0", "HOST:PORT"),
    ("head:99999", "HOST:PORT"),
    ("a b:6379", "HOST:PORT"),
    ("head:6379; rm -rf /", "HOST:PORT"),
])
def test_bad_ray_addresses_are_refused(address, fix_part):
    with pytest.raises(ConfigError) as err:
        validate_ray_address(address)
    assert err.value.field == "ray_address" and fix_part in err.value.fix


@pytest.mark.parametrize("address", ["10.0.0.5:6379", "head-1.cluster.local:6379",
                                     "[::1]:6379", "auto"])
def test_good_ray_addresses_pass(address):
    assert validate_ray_address(address) == address


def test_ray_options_are_checked():
    for field, value in (("gpus_per_run", -1), ("cpus_per_run", 0), ("stop_grace_s", -1.0)):
        with pytest.raises(ConfigError) as err:
            RayOptions(**{field: value})
        assert err.value.field == field


def test_a_port_that_is_not_a_ray_head_is_not_called_a_cluster():
    """The probe speaks gRPC's HTTP/2 preface: an HTTP/1 server (like this app's own
    port) is "not a Ray cluster", never "reachable"."""
    import http.server
    import threading

    pytest.importorskip("ray", reason="Ray is not installed (pip install -r requirements-ray.txt)")
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        problem = ray_problem(f"127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
    assert problem is not None and "is not a Ray cluster" in problem, problem


def test_the_ray_probe_is_bounded_in_all_by_its_setting(monkeypatch):
    """A port that accepts and never answers: the probe gives up within its bound (connect,
    send and the first answer together), which $PRECISION_LAB_RAY_PROBE_TIMEOUT_S sets."""
    import socket
    import time

    from engine.cluster.ray_env import RAY_PROBE_TIMEOUT_ENV, probe_timeout_s, speaks_grpc

    assert probe_timeout_s() == 2.0  # the documented default
    monkeypatch.setenv(RAY_PROBE_TIMEOUT_ENV, "0.4")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        started = time.monotonic()
        answer = speaks_grpc("127.0.0.1", listener.getsockname()[1])
        elapsed_s = time.monotonic() - started
    assert answer == "it did not answer gRPC within 0.4 s"
    assert 0.3 < elapsed_s < 1.5, elapsed_s
    for bad in ("0", "-1", "nan", "61", "soon", "inf"):
        monkeypatch.setenv(RAY_PROBE_TIMEOUT_ENV, bad)
        with pytest.raises(ConfigError) as err:
            probe_timeout_s()
        assert err.value.field == RAY_PROBE_TIMEOUT_ENV and "[0.1, 60]" in str(err.value)


def test_the_sweep_page_uses_only_the_operators_ray_address(home, monkeypatch):
    monkeypatch.delenv("PRECISION_LAB_RAY_ADDRESS", raising=False)
    monkeypatch.delenv("PRECISION_LAB_RAY_ALLOW_ANY_ADDRESS", raising=False)
    at = _sweep_page()
    at.radio(key="sw_where").set_value("Ray cluster").run()
    assert at.text_input(key="sw_ray_address_fixed").disabled
    assert not [t for t in at.text_input if t.key == "sw_ray_address"]  # nothing to type into
    assert any("No Ray cluster is configured" in w.value for w in at.warning)
    assert at.button(key="sw_create").disabled
    monkeypatch.setenv("PRECISION_LAB_RAY_ALLOW_ANY_ADDRESS", "1")  # the operator allows it
    at = _sweep_page()
    at.radio(key="sw_where").set_value("Ray cluster").run()
    at.text_input(key="sw_ray_address").set_value("127.0.0.1:1").run()
    # Typing connects nowhere: the probe runs only on the explicit check.
    assert any("Check the Ray cluster before" in i.value for i in at.info)
    assert not at.error


def test_an_unreachable_ray_head_is_reported_plainly():
    with __import__("socket").socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    problem = ray_problem(f"127.0.0.1:{port}")
    assert problem is not None
    assert (f"cannot reach the Ray cluster at 127.0.0.1:{port}" in problem
            or "Ray is not installed" in problem)


# ---------------------------------------------------------------------------------------
# the results matrix (hand-written summaries: exact numbers)


def _summary_run(store: Store, sweep_id: str, position: int, model: str, precision: str,
                 batch: int, status: str, **summary) -> str:
    cfg = RunConfig(model=model, size="tiny", precision=precision, batch_size=batch, steps=5)
    run_id = store.create_run(cfg, "cpu", "test cpu")
    store.set_status(run_id, RUNNING)
    store.merge_summary(run_id, summary)
    store.set_status(run_id, status)
    store.link_sweep_run(sweep_id, run_id, position)
    return run_id


def test_results_matrix_values_against_the_fp32_baseline(store):
    grid = SweepGrid(models="mlp", precisions="bf16-amp,fp32", batch_sizes="8,16")
    sweep_id = store.create_sweep(grid.to_dict(), SWEEP_LOCAL)
    rows = [("bf16-amp", 8, FINISHED, 300.0, 2 * 2**30, 1.5),
            ("fp32", 8, FINISHED, 200.0, 3 * 2**30, 1.25),
            ("bf16-amp", 16, STOPPED, 50.0, 2**30, 2.0),
            ("fp32", 16, FINISHED, 400.0, 2**29, 1.0)]
    for position, (precision, batch, status, rate, peak, loss) in enumerate(rows):
        _summary_run(store, sweep_id, position, "mlp", precision, batch, status,
                     samples_per_s=rate, peak_mem_bytes=peak, final_loss=loss)
    view = sweep_view(store, sweep_id)
    assert view.status == SWEEP_DONE and view.counts == {FINISHED: 3, STOPPED: 1}

    speed = results_matrix(view, "throughput_x")
    assert speed["baseline"] == "fp32"  # fp32 is the baseline even when listed second
    frame = speed["values"]["mlp"]
    assert list(frame.index) == ["bf16-amp", "fp32"] and list(frame.columns) == [8, 16]
    assert frame.loc["bf16-amp", 8] == pytest.approx(1.5)
    assert frame.loc["fp32", 8] == pytest.approx(1.0)
    assert math.isnan(frame.loc["bf16-amp", 16])  # stopped: no result, status says why
    assert speed["status"]["mlp"].loc["bf16-amp", 16] == STOPPED

    assert results_matrix(view, "peak_mem_gib")["values"]["mlp"].loc["fp32", 16] == 0.5
    assert results_matrix(view, "final_loss")["values"]["mlp"].loc["bf16-amp", 8] == 1.5
    text = matrix_text(speed)
    assert "baseline fp32" in text and "1.50x" in text and "n/a (stopped)" in text


def test_without_fp32_the_first_precision_is_the_baseline(store):
    grid = SweepGrid(models="mlp", precisions="bf16-amp,fp16-amp", batch_sizes="8")
    sweep_id = store.create_sweep(grid.to_dict(), SWEEP_LOCAL)
    _summary_run(store, sweep_id, 0, "mlp", "bf16-amp", 8, FINISHED, samples_per_s=100.0)
    _summary_run(store, sweep_id, 1, "mlp", "fp16-amp", 8, FINISHED, samples_per_s=250.0)
    matrix = results_matrix(sweep_view(store, sweep_id), "throughput_x")
    assert matrix["baseline"] == "bf16-amp"
    assert matrix["values"]["mlp"].loc["fp16-amp", 8] == pytest.approx(2.5)


# ---------------------------------------------------------------------------------------
# what each ratio may claim, and the heatmap that draws it (hand-written step times)

BASE_STEPS_MS = [10.0, 10.2, 9.8, 10.1, 9.9, 10.0, 10.3, 9.7]


def _claims_sweep(store: Store) -> str:
    """mlp x (fp32, bf16-amp, fp16-amp, bf16-pure) x (8, 16), every kind of cell:
    bs 8: 2x significant, 1.01x inconclusive (overlapping step times), 16.54x on a busy
    machine; bs 16: stopped, inconclusive for want of step times, 0.5x significant."""
    grid = SweepGrid(models="mlp", precisions="fp32,bf16-amp,fp16-amp,bf16-pure",
                     batch_sizes="8,16")
    sweep_id = store.create_sweep(grid.to_dict(), SWEEP_LOCAL)
    wide = [9.0, 9.5, 9.8, 10.0, 10.3, 10.5, 10.6, 11.0]
    rows = [("fp32", 8, FINISHED, 100.0, BASE_STEPS_MS, False),
            ("bf16-amp", 8, FINISHED, 200.0, [v / 2 for v in BASE_STEPS_MS], False),
            ("fp16-amp", 8, FINISHED, 101.0, wide, False),
            ("bf16-pure", 8, FINISHED, 1654.0, [v / 16.54 for v in BASE_STEPS_MS], True),
            ("fp32", 16, FINISHED, 400.0, BASE_STEPS_MS, False),
            ("bf16-amp", 16, STOPPED, 50.0, [], False),
            ("fp16-amp", 16, FINISHED, 800.0, [], False),
            ("bf16-pure", 16, FINISHED, 200.0, [v * 2 for v in BASE_STEPS_MS], False)]
    for position, (precision, batch, status, rate, steps, busy) in enumerate(rows):
        _summary_run(store, sweep_id, position, "mlp", precision, batch, status,
                     samples_per_s=rate, contention={"busy": busy},
                     **{COMPARE_STATS_KEY: {"steady_step_ms": steps}})
    return sweep_id


def test_each_ratio_says_what_it_may_claim_with_its_interval(store):
    matrix = results_matrix(sweep_view(store, _claims_sweep(store)), "throughput_x")
    claims, low, high = (matrix[name]["mlp"] for name in ("claims", "interval_low",
                                                          "interval_high"))
    assert claims.loc["fp32", 8] == RATIO_BASELINE
    assert claims.loc["bf16-amp", 8] == RATIO_SIGNIFICANT and low.loc["bf16-amp", 8] > 1.0
    assert claims.loc["fp16-amp", 8] == RATIO_INCONCLUSIVE
    assert low.loc["fp16-amp", 8] < 1.0 < high.loc["fp16-amp", 8]
    # busy whatever its interval says: the interval is there, far above 1, and claims nothing
    assert claims.loc["bf16-pure", 8] == RATIO_BUSY and low.loc["bf16-pure", 8] > 10
    assert claims.loc["bf16-amp", 16] == ""  # stopped: no ratio
    assert claims.loc["fp16-amp", 16] == RATIO_INCONCLUSIVE and math.isnan(low.loc["fp16-amp", 16])
    assert claims.loc["bf16-pure", 16] == RATIO_SIGNIFICANT and high.loc["bf16-pure", 16] < 1.0
    value, interval, status = cell_hover(matrix, "mlp", "bf16-amp", 8)
    assert value == "2.00x (200.0 samples/s)"
    assert interval == (f"95 % interval {low.loc['bf16-amp', 8]:.2f}-"
                        f"{high.loc['bf16-amp', 8]:.2f}x")  # as on Compare and the report
    assert status.startswith("significant")
    assert cell_hover(matrix, "mlp", "bf16-pure", 8)[2].startswith("busy")
    assert cell_hover(matrix, "mlp", "fp16-amp", 16)[1:] == (
        "no interval (too few steady steps)", "inconclusive: not shown to differ from 1x")
    assert cell_hover(matrix, "mlp", "bf16-amp", 16) == ("no value", "no interval", STOPPED)
    # The CLI's text keeps its short notes.
    text = matrix_text(matrix)
    assert "16.54x busy" in text and "1.01x n.s." in text and "2.00x [" in text


def test_heatmap_greys_unclaimed_ratios_and_colours_the_rest_by_log2(home, store):
    sweep_id = _claims_sweep(store)
    matrix = results_matrix(sweep_view(store, sweep_id), "throughput_x")
    at = _sweep_page()
    (spec,) = _heatmaps(at).values()
    coloured, grey = spec["data"]
    rows = coloured["y"]
    assert rows == ["fp32", "bf16-amp", "fp16-amp", "bf16-pure"] and grey["y"] == rows

    def cell(trace, key, precision, batch):
        return trace[key][rows.index(precision)][[8, 16].index(batch)]

    unclaimed = [("fp16-amp", 8), ("bf16-pure", 8), ("fp16-amp", 16)]
    for precision, batch in unclaimed:  # grey, with its word, never coloured by value
        assert cell(coloured, "z", precision, batch) is None
        assert cell(grey, "z", precision, batch) is not None
    assert cell(grey, "text", "bf16-pure", 8).startswith("16.54x busy<br>")
    assert cell(grey, "text", "fp16-amp", 8).startswith("1.01x n.s.<br>")
    claimed = [("fp32", 8), ("bf16-amp", 8), ("fp32", 16), ("bf16-pure", 16)]
    for precision, batch in claimed + [("bf16-amp", 16)]:
        assert (
            cell(grey, "z", precision, batch) is None and cell(grey, "text", precision, batch) == ""
        )
    assert [cell(coloured, "z", p, b) for p, b in claimed] == pytest.approx([0.0, 1.0, 0.0, -1.0])
    assert cell(coloured, "z", "bf16-amp", 16) is None  # stopped: its status as text
    assert cell(coloured, "text", "bf16-amp", 16) == STOPPED
    assert {grey["colorscale"][0][1], grey["colorscale"][-1][1]} == {"#a3a3a3"}
    assert grey["showscale"] is False

    # log2 around 1x, symmetric, its range set by the coloured cells only (not the busy 16.54x)
    assert coloured["zmid"] == 0 and coloured["zmin"] == -coloured["zmax"] == -1.0
    bar = coloured["colorbar"]
    assert bar["ticktext"] == ["0.5x", "1x", "2x"]
    assert [2.0 ** v for v in bar["tickvals"]] == [0.5, 1.0, 2.0]

    # every cell's hover: value, interval, status (the same on both traces)
    assert "%{customdata[1]}" in coloured["hovertemplate"]
    assert grey["hovertemplate"] == coloured["hovertemplate"]
    value, interval, status = cell(coloured, "customdata", "bf16-amp", 8)
    low, high = (matrix[name]["mlp"].loc["bf16-amp", 8] for name in ("interval_low",
                                                                      "interval_high"))
    assert (value, interval) == ("2.00x (200.0 samples/s)", f"95 % interval {low:.2f}-{high:.2f}x")
    assert status.startswith("significant")
    assert cell(grey, "customdata", "bf16-pure", 8)[2].startswith("busy")
    assert cell(grey, "customdata", "fp16-amp", 8)[2].startswith("inconclusive")
    assert cell(coloured, "customdata", "bf16-amp", 16)[2] == STOPPED


def test_heatmap_of_an_absolute_metric_keeps_its_sequential_scale(home, store):
    _claims_sweep(store)
    at = _sweep_page()
    at.selectbox(key="sw_metric").set_value("samples_per_s").run()
    assert not at.exception, at.exception
    (spec,) = _heatmaps(at).values()
    (trace,) = spec["data"]  # nothing greyed: only ratios make claims
    assert trace["z"][0] == [100.0, 400.0] and trace["z"][3] == [1654.0, 200.0]
    assert "zmid" not in trace and "tickvals" not in trace.get("colorbar", {})
    assert trace["colorscale"][0][1] == "#440154"  # Viridis
    assert "%{customdata[1]}" not in trace["hovertemplate"]
    assert trace["customdata"][0][0] == ["100.0 samples/s", "", FINISHED]


# ---------------------------------------------------------------------------------------
# store: the sweep tables on a database that predates them


def test_a_database_without_sweep_tables_gains_them_on_open(store, home):
    run_id = store.create_run(RunConfig(model="mlp"), "cpu")
    with sqlite3.connect(home / DB_FILENAME) as conn:
        conn.execute("DROP TABLE sweep_runs")
        conn.execute("DROP TABLE sweeps")
    reopened = Store(home)
    assert reopened.get_run(run_id).status == QUEUED
    assert reopened.list_sweeps() == []
    sweep_id = reopened.create_sweep({"models": ["mlp"]}, SWEEP_LOCAL)
    reopened.link_sweep_run(sweep_id, run_id, 0)
    assert reopened.sweep_of_run(run_id).run_ids == [run_id]


# ---------------------------------------------------------------------------------------
# a real local sweep: 2 x 1 x 1 through the launcher's FIFO queue

LOCAL_GRID = SweepGrid(models="mlp", precisions="fp32,bf16-amp", batch_sizes="8", steps=12,
                       device="cpu", profile=False)


@pytest.fixture(scope="module")
def local_sweep(module_homes):
    store = Store(module_homes("local_sweep"))
    sweep_id = create_sweep(LOCAL_GRID, store)
    view = wait_sweep(store, sweep_id, timeout_s=150)
    return store, view


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_local_sweep_runs_every_grid_point_in_turn_and_finishes(local_sweep):
    store, view = local_sweep
    assert view.sweep.backend == SWEEP_LOCAL and view.status == SWEEP_DONE
    assert [(r.config.precision, r.status) for r in view.runs] == [("fp32", FINISHED),
                                                                  ("bf16-amp", FINISHED)]
    first, second = view.runs
    # One device, FIFO: the second run started after the first one had ended.
    assert second.started_at >= first.ended_at
    for run in view.runs:
        assert run.device_key == "cpu" and run.steps_completed == 12
        assert store.metrics_count(run.id) == 12
    matrix = results_matrix(view, "throughput_x")["values"]["mlp"]
    assert matrix.loc["fp32", 8] == pytest.approx(1.0)
    expected = (view.runs[1].summary["samples_per_s"] / view.runs[0].summary["samples_per_s"])
    assert matrix.loc["bf16-amp", 8] == pytest.approx(expected)
    peaks = results_matrix(view, "peak_mem_gib")["values"]["mlp"]
    assert peaks.loc["fp32", 8] == pytest.approx(first.summary["peak_mem_bytes"] / 2**30)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_cli_show_and_list_report_the_sweep(local_sweep):
    store, view = local_sweep
    env_home = str(store.home)
    out = _cli_subprocess(env_home, "sweep", "show", view.sweep.id, "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.splitlines()[-1])
    assert info["status"] == SWEEP_DONE and info["backend"] == SWEEP_LOCAL
    assert [r["status"] for r in info["runs"]] == [FINISHED, FINISHED]
    assert info["matrix"]["values"]["mlp"]["fp32"]["8"] == pytest.approx(1.0)
    text = _cli_subprocess(env_home, "sweep", "show", view.sweep.id, "--metric", "final_loss")
    assert "final loss" in text.stdout and "bs8" in text.stdout and "finished" in text.stdout
    listing = json.loads(_cli_subprocess(env_home, "sweep", "list", "--json").stdout)
    assert [s["sweep_id"] for s in listing] == [view.sweep.id]
    assert listing[0]["run_counts"] == {FINISHED: 2}


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_sweep_page_shows_the_runs_and_one_heatmap_per_model(local_sweep, monkeypatch):
    store, view = local_sweep
    monkeypatch.setenv("PRECISION_LAB_HOME", str(store.home))
    at = _sweep_page()
    assert any("on this machine" in md.value and "2 finished" in md.value for md in at.markdown)
    specs = _heatmaps(at)
    assert list(specs) == ["mlp: throughput vs the baseline precision (x), baseline fp32"]
    trace = specs[list(specs)[0]]["data"][0]
    assert trace["type"] == "heatmap" and trace["y"] == ["fp32", "bf16-amp"]
    assert trace["z"][0][0] == pytest.approx(0.0)  # log2 of the baseline's 1x
    at.selectbox(key="sw_metric").set_value("peak_mem_gib").run()
    assert not at.exception, at.exception
    assert list(_heatmaps(at)) == ["mlp: peak memory (GiB)"]
    at.button(key="sw_open_live").click().run()
    assert not at.exception, at.exception
    assert at.session_state["live_run_id"] == view.runs[0].id


# ---------------------------------------------------------------------------------------
# the page's form: a sweep created and stopped through its widgets


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_form_counts_runs_caps_the_grid_creates_and_stops_a_sweep(home, store, one_thread_workers):
    at = _sweep_page()
    assert "No sweeps yet" in " ".join(info.value for info in at.info)
    at.multiselect(key="sw_models").set_value(["mlp", "gpt", "resnet"])
    at.multiselect(key="sw_precisions").set_value(["fp32", "bf16-amp", "fp16-amp", "bf16-pure"])
    at.text_input(key="sw_batch_sizes").set_value("1, 2, 4, 8, 16").run()
    assert "**60 runs**" in " ".join(md.value for md in at.markdown)
    assert any(f"more than the {MAX_SWEEP_RUNS}" in e.value for e in at.error)
    assert at.button(key="sw_create").disabled

    at.multiselect(key="sw_models").set_value(["mlp"])
    at.multiselect(key="sw_precisions").set_value(["fp32"])
    at.text_input(key="sw_batch_sizes").set_value("8, 16")
    at.number_input(key="sw_steps").set_value(100_000)
    at.checkbox(key="sw_profile").uncheck().run()
    assert "**2 runs**" in " ".join(md.value for md in at.markdown)
    at.button(key="sw_create").click().run()
    assert not at.exception, at.exception
    (sweep,) = store.list_sweeps()
    assert len(sweep.run_ids) == 2 and sweep.backend == SWEEP_LOCAL
    first = sweep.run_ids[0]
    wait_for(
        lambda: store.get_run(first).status == RUNNING,
        60,
        interval_s=0.2,
        message="the first run to start",
    )
    assert store.get_run(sweep.run_ids[1]).status == QUEUED  # one run per device

    at.run()
    at.button(key="sw_stop_sweep").click().run()
    assert not at.exception, at.exception
    assert [store.get_run(r).status for r in sweep.run_ids] == [STOPPED, STOPPED]
    assert sweep_view(store, sweep.id).status == SWEEP_DONE


# ---------------------------------------------------------------------------------------
# CLI contract: exit 2, one stderr line naming the flag, no traceback


@pytest.mark.parametrize("args, starts", [
    (["--precisions", "fp64"], "error: --precisions 'fp64': unknown precision"),
    (["--models", "mlp,bert"], "error: --models 'bert': unknown model"),
    (["--batch-sizes", "8,0"], "error: --batch-sizes '0': a whole number"),
    (["--steps", "0"], "error: --steps 0: out of range"),
    (["--size", "huge"], "error: --size 'huge': unknown size"),
    (["--precisions", "tf32", "--device", "cpu"], "error: --precisions 'tf32': not supported"),
    (["--ray-address", "ray://head:10001"], "error: --ray-address 'ray://head:10001': Ray Client"),
    (["--ray-address", "nohost"], "error: --ray-address 'nohost': expected HOST:PORT"),
    (["--gpus-per-run", "99"], "error: --gpus-per-run 99: a whole number in [0, 8]"),
    (["--metric", "speed"], "error: --metric 'speed': unknown metric"),
    (["--models", "mlp,gpt,resnet", "--precisions", "fp32,bf16-amp,fp16-amp,bf16-pure",
      "--batch-sizes", "1,2,4,8,16"], "error: --models x --precisions x --batch-sizes"),
])
def test_cli_create_rejects_bad_input_with_one_line(home, capsys, args, starts):
    assert cli_main(["sweep", "create", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(starts), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert Store(home).list_sweeps() == []  # nothing was recorded


@pytest.mark.parametrize("args, starts", [
    (["show", "no-such-sweep"], "error: SWEEP_ID 'no-such-sweep': no such sweep"),
    (["stop", "../etc"], "error: SWEEP_ID '../etc': not a valid sweep id"),
    ([], "error: the following arguments are required: {create,list,show,stop}"),
])
def test_cli_sweep_ids_and_commands_are_checked(home, capsys, args, starts):
    assert cli_main(["sweep", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(starts) and err.count("\n") == 1, err


@pytest.mark.slow
def test_cli_error_as_a_real_process_exits_2_without_traceback(home):
    result = _cli_subprocess(str(home), "sweep", "create", "--precisions", "fp64;ls")
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: --precisions 'fp64;ls': unknown precision; choose "
                                     "from fp32, tf32, fp16-amp, bf16-amp, bf16-pure, fp8")


# ---------------------------------------------------------------------------------------
# Ray runs without a cluster: what the launcher does when the driver is not there


def _ray_sweep_with_one_run(store: Store, pid: int | None, created: float | None) -> str:
    sweep_id = store.create_sweep(SweepGrid().to_dict(), SWEEP_RAY, "127.0.0.1:6379",
                                  {"stop_grace_s": 0.5})
    run_id = store.create_run(RunConfig(model="mlp"), "ray", "Ray cluster: waiting")
    store.link_sweep_run(sweep_id, run_id, 0)
    if pid is not None:
        store.set_sweep_driver(sweep_id, pid, created)
        store.update_run(run_id, pid=pid, pid_create_time=created)
    return run_id


def _dead_process() -> tuple[int, float]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    created = process_create_time(proc.pid)
    proc.wait()
    return proc.pid, created


@pytest.mark.slow
def test_a_ray_run_whose_driver_died_fails_naming_the_driver(store):
    pid, created = _dead_process()
    run_id = _ray_sweep_with_one_run(store, pid, created)
    store.set_run_placement(run_id, "cpu@10.0.0.5", "a CPU on 10.0.0.5")
    store.set_status(run_id, RUNNING, only_from=(QUEUED,))
    assert reconcile(store) == [run_id]
    run = store.get_run(run_id)
    assert run.status == FAILED
    assert f"the Ray sweep driver (pid {pid})" in run.reason and "driver.log" in run.reason


def test_a_failed_sweep_and_its_runs_fail_in_one_write_keeping_the_first_reason(store):
    run_id = _ray_sweep_with_one_run(store, None, None)
    ended_run = store.create_run(RunConfig(model="mlp"), "ray", "Ray cluster: waiting")
    sweep_id = store.sweep_of_run(run_id).id
    store.link_sweep_run(sweep_id, ended_run, 1)
    store.set_status(ended_run, STOPPED, "stopped by the user", only_from=(QUEUED,))
    store.fail_sweep(sweep_id, [run_id, ended_run], "no Ray cluster answered")
    store.fail_sweep(sweep_id, [run_id, ended_run], "ray.init failed too")  # the second thread
    sweep = store.get_sweep(sweep_id)
    run = store.get_run(run_id)
    assert (sweep.status, sweep.reason) == ("failed", "no Ray cluster answered")
    assert (run.status, run.reason) == (FAILED, "no Ray cluster answered")
    assert run.ended_at == sweep.ended_at  # one transaction: no reader sees one without the other
    assert store.get_run(ended_run).status == STOPPED  # an ended run keeps its own ending
    assert sweep_view(store, sweep_id).status == "failed"


@pytest.mark.slow
def test_stopping_a_queued_ray_run_is_immediate_and_signals_nothing(store):
    # The run's pid is a live stand-in for the sweep's driver: the stop must go through
    # the store, never as a signal to the driver's process group.
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              start_new_session=True)
    try:
        run_id = _ray_sweep_with_one_run(store, driver.pid, process_create_time(driver.pid))
        started = time.monotonic()
        run = stop(run_id, store)
        assert run.status == STOPPED and run.reason == "stopped while queued"
        assert time.monotonic() - started < 1.0
        assert run_id in store.stop_requests(store.sweep_of_run(run_id).id)
        assert driver.poll() is None, "the driver's process group was signalled"
    finally:
        driver.kill()
        driver.wait()


@pytest.mark.slow
def test_stopping_a_running_ray_run_whose_driver_is_gone_marks_it_stopped(store):
    pid, created = _dead_process()
    run_id = _ray_sweep_with_one_run(store, pid, created)
    store.set_status(run_id, RUNNING, only_from=(QUEUED,))
    run = stop(run_id, store)
    assert run.status == STOPPED and "Ray sweep driver was not running" in run.reason


# ---------------------------------------------------------------------------------------
# helpers


def _cli_subprocess(home: str, *args: str) -> subprocess.CompletedProcess:
    from conftest import cli_command, cli_env

    return subprocess.run(cli_command(*args), cwd=str(Path(APP).parent), env=cli_env(Path(home)),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def _sweep_page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/sweep.py").run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Sweeps"
    return at


def _heatmaps(at: AppTest) -> dict[str, dict]:
    specs = {}
    specs.update(charts_by_title(at))
    return specs

