"""Sweeps on a real Ray cluster: a head on 127.0.0.1 (2 CPUs, no GPUs) started for this
module with `ray start`, torn down with `ray stop --force`, after which no process of it
may be left.

Skipped only when `import ray` fails; requirements-dev.txt installs Ray (through
requirements-ray.txt), so in CI these tests run.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import wait_for

pytest.importorskip("ray", reason="Ray is not installed (pip install -r requirements-ray.txt)")

from streamlit.testing.v1 import AppTest  # noqa: E402

from engine.cluster.ray_env import RayOptions
from engine.cluster.sweep import (
    SweepGrid,
    create_sweep,
    results_matrix,
    stop_sweep,
    sweep_view,
    wait_sweep,
)
from engine.config import ConfigError
from engine.proc import is_alive
from engine.run.launcher import stop  # noqa: E402
from engine.schema import FINISHED, RUNNING, STOPPED, SWEEP_DONE, SWEEP_FAILED, SWEEP_RAY
from engine.store import Store
from tests.chart_support import charts_by_title

APP = str(Path(__file__).resolve().parent.parent / "app.py")
RAY_CLI = [sys.executable, "-m", "ray.scripts.scripts"]
OBJECT_STORE_BYTES = 150 * 2**20

pytestmark = [pytest.mark.slow]


# ---------------------------------------------------------------------------------------
# the cluster


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cluster_processes(temp_dir: Path) -> list:
    """The head's processes (their command lines name our temp dir) and everything they
    started (workers rename themselves `ray::...`, so they are found as descendants)."""
    import psutil

    found = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if str(temp_dir) in " ".join(proc.info["cmdline"] or []):
                found[proc.pid] = proc
                for child in proc.children(recursive=True):
                    found[child.pid] = child
        except psutil.Error:
            continue
    return list(found.values())


@pytest.fixture(scope="module")
def ray_address():
    # Short path: Ray's unix socket paths live under it and have a length limit.
    temp_dir = Path(tempfile.mkdtemp(prefix="plray-", dir="/tmp"))
    port = _free_port()
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    start = subprocess.run(
        [*RAY_CLI, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
         "--num-cpus", "2", "--num-gpus", "0", "--include-dashboard=false",
         "--disable-usage-stats", "--temp-dir", str(temp_dir),
         "--object-store-memory", str(OBJECT_STORE_BYTES)],
        capture_output=True, text=True, timeout=180, env=env, stdin=subprocess.DEVNULL)
    try:
        assert start.returncode == 0, f"ray start failed:\n{start.stdout}\n{start.stderr}"
        yield f"127.0.0.1:{port}"
    finally:
        ours = _cluster_processes(temp_dir)
        subprocess.run([*RAY_CLI, "stop", "--force"], capture_output=True, timeout=120,
                       stdin=subprocess.DEVNULL)
        left = _wait_gone(ours, timeout_s=15)
        for proc in left:  # never leave a raylet or worker eating the CI cores
            try:
                proc.send_signal(signal.SIGKILL)
            except Exception:  # noqa: BLE001 - gone meanwhile
                pass
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, f"Ray processes left after `ray stop --force`: {left}"
        assert ours or start.returncode != 0, "no process of the Ray head was found, so the " \
                                              "leftover check above could not see any"


def _wait_gone(processes: list, timeout_s: float) -> list:
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in processes if _running(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _running(proc) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture(scope="module")
def lab(module_homes) -> Store:
    return Store(module_homes("ray_sweep"))


# ---------------------------------------------------------------------------------------
# a sweep that completes

GRID = SweepGrid(models="mlp", precisions="fp32,bf16-amp", batch_sizes="8", steps=20,
                 size="tiny", profile=True)


@pytest.fixture(scope="module")
def finished_sweep(ray_address, lab):
    sweep_id = create_sweep(GRID, lab, ray_address=ray_address)
    view = wait_sweep(lab, sweep_id, timeout_s=180)
    return view


@pytest.mark.timeout(300)
def test_a_ray_sweep_finishes_with_metrics_telemetry_traces_and_summaries(finished_sweep, lab,
                                                                          ray_address):
    view = finished_sweep
    assert view.status == SWEEP_DONE, [(r.status, r.reason) for r in view.runs]
    sweep = view.sweep
    wait_for(
        lambda: not is_alive(sweep.driver_pid, sweep.driver_pid_create_time),
        30,
        interval_s=0.2,
        message="the driver to exit",
    )
    sweep = lab.get_sweep(sweep.id)
    assert sweep.backend == SWEEP_RAY and sweep.ray_address == ray_address
    assert sweep.status == SWEEP_DONE  # recorded by the driver itself before it exits
    for run in view.runs:
        assert run.status == FINISHED, (run.status, run.reason)
        # Where Ray placed it; a key no local device queue uses.
        assert re.fullmatch(r"cpu@[0-9.]+", run.device_key), run.device_key
        assert run.pid == sweep.driver_pid
        assert lab.metrics_count(run.id) == 20 and run.steps_completed == 20
        summary = run.summary
        assert summary["samples_per_s"] > 0 and math.isfinite(summary["final_loss"])
        assert summary["steps_completed"] == 20 and summary["param_count"] > 0
        # The peak lookup ran on the node: a figure, or (two tasks measuring beside each
        # other's training) the refusal to keep one taken while busy.
        assert summary["peak_flops"] or "busy" in summary["mfu_note"], summary.get("mfu_note")
        # The profiler window's trace and the CPU evidence came back through the actor.
        trace = lab.run_dir(run.id) / "trace.json.gz"
        assert trace.stat().st_size > 1000
        # Relative to the data directory (no absolute path of this machine in a summary).
        assert summary["trace_path"] == f"runs/{run.id}/trace.json.gz"
        assert lab.home / summary["trace_path"] == trace
        assert summary["cpu_evidence"]["verdict"]
        assert len(lab.read_telemetry(run.id)) > 0
        log = (lab.run_dir(run.id) / "worker.log").read_text()
        assert f"[ray task] run {run.id}:" in log and "Ray worker pid" in log
    matrix = results_matrix(view, "throughput_x")["values"]["mlp"]
    assert matrix.loc["fp32", 8] == pytest.approx(1.0)
    rates = {r.config.precision: r.summary["samples_per_s"] for r in view.runs}
    assert matrix.loc["bf16-amp", 8] == pytest.approx(rates["bf16-amp"] / rates["fp32"])


# ---------------------------------------------------------------------------------------
# stopping: cooperative within the grace period, then ray.cancel(force=True)

LONG = SweepGrid(models="mlp", precisions="fp32", batch_sizes="8", steps=200_000, profile=False)


@pytest.mark.timeout(300)
def test_stopping_ray_runs_ends_their_tasks_cooperatively_or_by_force(ray_address, lab):
    # Two one-run sweeps at once (one CPU each): one stops by itself, one is cancelled.
    # A generous grace: on a loaded CI machine the polite stop must not turn into a cancel.
    polite = create_sweep(LONG, lab, ray_address=ray_address,
                          ray_options=RayOptions(stop_grace_s=30.0))
    forced = create_sweep(LONG, lab, ray_address=ray_address,
                          ray_options=RayOptions(stop_grace_s=0.0))
    (polite_run,) = lab.get_sweep(polite).run_ids
    (forced_run,) = lab.get_sweep(forced).run_ids
    for run_id in (polite_run, forced_run):
        wait_for(lambda: lab.get_run(run_id).status == RUNNING
                 and lab.get_run(run_id).steps_completed >= 5, 120, interval_s=0.2,
                 message=f"run {run_id} to train")

    started = time.monotonic()
    run = stop(polite_run, lab)  # what the Live page and `python -m engine stop` call
    assert run.status == STOPPED, (run.status, run.reason)
    assert re.fullmatch(r"stopped by request at step \d+", run.reason), run.reason
    assert time.monotonic() - started < 30
    assert lab.metrics_count(polite_run) >= 5  # what it trained is kept

    worker_pid = _ray_worker_pid(lab, forced_run)
    (run,) = stop_sweep(forced, lab)  # what the Sweep page's "Stop sweep" calls
    assert run.status == STOPPED, (run.status, run.reason)
    assert "Ray task force-cancelled after 0 s" in run.reason
    wait_for(lambda: not _pid_running(worker_pid), 20, interval_s=0.2,
             message="the cancelled task's Ray worker to exit")

    for sweep_id in (polite, forced):
        sweep = lab.get_sweep(sweep_id)
        wait_for(
            lambda: not is_alive(sweep.driver_pid, sweep.driver_pid_create_time),
            30,
            interval_s=0.2,
            message=f"the driver of {sweep_id} to exit",
        )
        assert lab.get_sweep(sweep_id).status == SWEEP_DONE
        assert sweep_view(lab, sweep_id).status == SWEEP_DONE


def _ray_worker_pid(store: Store, run_id: str) -> int:
    log = (store.run_dir(run_id) / "worker.log").read_text()
    return int(re.search(r"Ray worker pid (\d+)", log).group(1))


def _pid_running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# ---------------------------------------------------------------------------------------
# a port that answers TCP but is no Ray head


@pytest.mark.timeout(120)
def test_an_address_that_is_not_a_ray_head_is_refused_before_any_sweep_exists(lab):
    with socket.socket() as listener:  # accepts connections, never speaks Ray's protocol
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        sweeps_before = len(lab.list_sweeps())
        with pytest.raises(ConfigError) as info:
            create_sweep(LONG, lab, ray_address=address,
                         ray_options=RayOptions(connect_timeout_s=3.0))
    assert f"{address} is not a Ray cluster (it did not answer gRPC" in str(info.value)
    assert len(lab.list_sweeps()) == sweeps_before  # nothing created, no driver started


class _SilentGrpcServer:
    """Answers gRPC's connection preface with an HTTP/2 SETTINGS frame (so the probe takes
    it for a cluster), then never answers again: a head that hangs."""

    SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"

    def __init__(self):
        import threading

        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            try:
                conn.sendall(self.SETTINGS)
            except OSError:
                pass

    def close(self) -> None:
        for conn in [self.listener, *self.conns]:
            conn.close()


@pytest.mark.timeout(180)
def test_a_head_that_never_answers_fails_the_sweep_within_the_connect_timeout(lab):
    server = _SilentGrpcServer()
    try:
        started = time.monotonic()
        sweep_id = create_sweep(LONG, lab, ray_address=server.address,
                                ray_options=RayOptions(connect_timeout_s=5.0))
        view = wait_sweep(lab, sweep_id, timeout_s=150)
        elapsed_s = time.monotonic() - started
    finally:
        server.close()
    sweep = lab.get_sweep(sweep_id)
    assert sweep.status == SWEEP_FAILED, sweep
    assert (f"no Ray cluster answered at {server.address} within 5 s" in sweep.reason
            ), sweep.reason
    assert all(run.status == "failed" for run in view.runs), view.runs
    # ray.init never returns against it: the driver's watchdog ends it (Ray's import and
    # start-up come on top of the 5 s on a loaded 2-core machine)
    assert elapsed_s < 120, elapsed_s
    assert not is_alive(sweep.driver_pid, sweep.driver_pid_create_time)


# ---------------------------------------------------------------------------------------
# the Sweep page


@pytest.mark.timeout(300)
def test_sweep_page_shows_the_ray_sweep_its_placement_and_heatmap(finished_sweep, lab,
                                                                  ray_address, monkeypatch):
    monkeypatch.setenv("PRECISION_LAB_HOME", str(lab.home))
    monkeypatch.setenv("PRECISION_LAB_RAY_ADDRESS", ray_address)  # the operator's cluster
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/sweep.py").run()
    assert not at.exception, at.exception
    at.selectbox(key="sw_select").set_value(finished_sweep.sweep.id).run()
    assert not at.exception, at.exception
    text = " ".join(md.value for md in at.markdown)
    assert f"on Ray cluster at {ray_address}" in text and "2 finished" in text
    table = at.dataframe[0].value
    assert list(table["precision"]) == ["fp32", "bf16-amp"]
    assert all(re.fullmatch(r"cpu@[0-9.]+", key) for key in table["device"])
    specs = {}
    specs.update(charts_by_title(at))
    heat = specs["mlp: throughput vs the baseline precision (x), baseline fp32"]["data"][0]
    assert heat["type"] == "heatmap" and heat["z"][0][0] == pytest.approx(
        0.0
    )  # log2(1x): the baseline

    # The Ray part of the form: the operator's address, checked on request; a Ray head
    # answers, so nothing is in error and the sweep can be created.
    at.radio(key="sw_where").set_value("Ray cluster").run()
    assert at.text_input(key="sw_ray_address_fixed").disabled
    assert at.button(key="sw_create").disabled  # not before the check
    at.button(key="sw_ray_check").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert any("answered" in c.value for c in at.caption)
    assert not at.button(key="sw_create").disabled


# ---------------------------------------------------------------------------------------
# one job's rank traces read on the cluster


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_rank_set_read_on_ray_matches_the_local_read_and_names_the_slowed_rank(
        ray_address, tmp_path):
    """16 ranks built from the two real rank traces (each its own rank id, rank 5 slowed
    by 1.3x) and one file that is no trace: read as Ray tasks, the per-rank table, the
    slowest rank and the waiting are the local path's, and the bad file is one line."""
    from test_trace_scale import RANK_SET, _events, _slowed, _write

    from engine.cluster.ray_traces import analyze_set_on_ray
    from engine.traces.sets import analyze_set, set_members

    folder = tmp_path / "job"
    folder.mkdir()
    sources = [_events(RANK_SET / "rank-0.json.gz"), _events(RANK_SET / "rank-1.json.gz")]
    for rank in range(16):
        data = _slowed(sources[rank % 2], rank, 1.3 if rank == 5 else 1.0)
        data["distributedInfo"]["world_size"] = 16
        _write(folder / f"rank-{rank}.json.gz", data)
    members = set_members([folder])
    local = analyze_set(members)
    (folder / "rank-16.json").write_text("not a trace at all")
    progress: list[str] = []
    on_ray = analyze_set_on_ray(set_members([folder]), ray_address, on_progress=progress.append)
    assert on_ray["analysed_on"] == f"Ray cluster at {ray_address}"
    assert [row["rank"] for row in on_ray["ranks"]] == list(range(16))
    assert on_ray["ranks"] == local["ranks"]
    assert on_ray["slowest"]["rank"] == local["slowest"]["rank"] == 5
    assert on_ray["collectives_matched"] == local["collectives_matched"]
    (failed,) = on_ray["failed_ranks"]
    assert failed["source"] == "rank-16.json" and "plain text" in failed["error"]
    assert len(progress) == 17 and any("rank-16.json" in line for line in progress)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_rank_whose_ray_worker_is_killed_is_one_line_and_the_rest_are_shown(
        ray_address, tmp_path):
    """Four 96 MiB rank traces (the real V100 trace's steps repeated) read as Ray tasks;
    the worker reading one of them is killed (SIGKILL) mid-read: that rank is one line
    saying its worker died, and the other three are in the table."""
    import threading

    import psutil

    from bench._big_trace import build
    from engine.cluster.ray_traces import analyze_set_on_ray
    from engine.traces.sets import set_members

    folder = tmp_path / "job"
    folder.mkdir()
    source = tmp_path / "rank-source.json"
    build(Path(__file__).parent / "data" / "traces" / "v100_resnet50_kineto_v1.json.gz",
          source, 96 * 2**20)
    for rank in range(4):
        os.link(source, folder / f"rank-{rank}.json")
    result: dict = {}
    reader = threading.Thread(target=lambda: result.update(
        analyze_set_on_ray(set_members([folder]), ray_address)))
    reader.start()
    killed = []
    deadline = time.monotonic() + 120
    while not killed and reader.is_alive() and time.monotonic() < deadline:
        for proc in psutil.process_iter(["cmdline"]):
            if (proc.info["cmdline"] or [""])[0].startswith("ray::_read_rank"):
                proc.send_signal(signal.SIGKILL)  # a worker killed while it reads a rank
                killed.append(proc.pid)
                break
        time.sleep(0.05)
    reader.join(timeout=300)
    assert killed, "no Ray worker was seen reading a rank trace"
    assert not reader.is_alive() and result, "the set read did not end"
    (failed,) = result["failed_ranks"]
    assert failed["error"] == "the Ray worker reading it died (killed, or out of memory)"
    assert len(result["ranks"]) == 3
    assert failed["source"] not in {row["source"] for row in result["ranks"]}
