"""Pieces that otherwise run only inside worker, rank, driver or Ray processes, tested here
in this process against a real store (so the fast tier reaches every engine module): the
supervisor's exit record, a rank that finds its run not running, the session's metric
buffer and busy marker, the Live headline figures, a one-process gloo group with DDP
(slow tier: a process group is never started in the fast one), the Ray failure verdicts and
store actor, and the exports' availability checks."""

from __future__ import annotations

import signal
import socket

import pandas as pd
import pytest

from engine.config import RunConfig
from engine.schema import FAILED, RUNNING, STEADY, STOPPED


@pytest.fixture
def queued_run(store):
    return store.create_run(RunConfig(model="mlp", size="tiny", steps=10), "cpu", "test CPU")


# ---------------------------------------------------------------------------------------
# run/worker, run/rank, run/session


def test_a_trainer_killed_by_a_signal_is_recorded_with_the_signal_and_the_step(store, queued_run):
    from engine.run.worker import _record_exit

    store.set_status(queued_run, RUNNING)
    _record_exit(store, queued_run, -signal.SIGSEGV, stop_requested=False)
    run = store.get_run(queued_run)
    assert run.status == FAILED and run.reason.startswith(
        "worker exited with signal 11 (SIGSEGV) at step 0"
    )


def test_a_stop_request_wins_over_the_exit_code(store, queued_run):
    from engine.run.worker import _record_exit

    store.set_status(queued_run, RUNNING)
    _record_exit(store, queued_run, 1, stop_requested=True)
    assert store.get_run(queued_run).status == STOPPED


def test_a_rank_whose_run_is_not_running_does_nothing(store, queued_run, capsys):
    from engine.run.rank import run_rank

    saved = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        assert run_rank(queued_run, store, rank=1) == 0
    finally:
        signal.signal(signal.SIGTERM, saved[0])
        signal.signal(signal.SIGINT, saved[1])
    assert "is queued, not running; nothing to do" in capsys.readouterr().out


def test_the_busy_marker_marks_rows_from_the_latest_sample_and_keeps_steady_samples():
    from engine.run.session import ContentionMarker, run_relative_path

    class Sampler:
        latest = {"t_s": 3.0, "load_per_core": 2.0, "others_cpu_cores": 1.8, "cpu_pct": 40.0,
                  "steal_pct": 0.0}

    marker, emitted = ContentionMarker(Sampler()), []
    marker.wrap(emitted.extend)([{"step": 1, "phase": STEADY}, {"step": 2, "phase": "warmup"}])
    assert [row["host_busy"] for row in emitted] in ([1, 1], [0, 0])
    assert list(marker.steady_samples) == [3.0]
    assert run_relative_path("r1", "/x/y/trace.json.gz") == "runs/r1/trace.json.gz"


# ---------------------------------------------------------------------------------------
# analysis/live


def test_live_figures_come_from_steady_rows_only():
    from engine.analysis.live import eta_s, steady_median

    frame = pd.DataFrame({"step": [1, 2, 3, 4, 5], "phase": ["warmup"] + [STEADY] * 4,
                          "step_time_ms": [900.0, 10.0, 12.0, 11.0, 13.0],
                          "wall_time_s": [0.9, 0.91, 0.92, 0.93, 0.94]})
    assert steady_median(frame, "step_time_ms") == pytest.approx(11.5)
    remaining = eta_s(frame, steps_done=5, total_steps=105)
    assert remaining is not None and 0.5 < remaining < 3.0  # ~100 steps at ~11.5 ms


# ---------------------------------------------------------------------------------------
# training/parallel: a one-process gloo group on loopback


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # a real process group: its threads and its end are no fast-tier matter
def test_a_one_process_gloo_group_wraps_in_ddp_and_reduces_the_log_values(monkeypatch):
    import torch
    import torch.distributed as dist

    from engine.training.parallel import ParallelContext

    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(name, value)
    ctx = ParallelContext.start(RunConfig(model="mlp", size="tiny", nprocs=1), "cpu")
    try:
        assert (ctx.rank, ctx.world_size, ctx.backend, ctx.device_key) == (0, 1, "gloo", "cpu")
        wrapped = ctx.wrap(torch.nn.Linear(4, 2))
        assert type(wrapped).__name__ == "DistributedDataParallel"
        assert ctx.reduce_log_values(2.5, True) == (pytest.approx(2.5), True)
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------
# cluster: the Ray verdicts and the store actor's class, without a cluster


def test_ray_failures_become_statuses_with_their_cause():
    from ray import exceptions as rx

    from engine.cluster.ray_driver import failure_outcome

    assert failure_outcome(rx.TaskCancelledError(), 7, stop_asked=False, forced=True,
                           grace_s=5) == (STOPPED, "stopped by request at step 7 "
                                                   "(Ray task force-cancelled after 5 s)")
    status, reason = failure_outcome(RuntimeError("boom"), 3, False, False, 5)
    assert status == FAILED and reason == "Ray: RuntimeError at step 3: boom"


def test_the_store_actor_class_records_placement_rows_and_stops(store, queued_run):
    from engine.cluster.ray_tasks import StoreWriter

    writer = StoreWriter(str(store.home))
    assert writer.started(queued_run, "cpu@10.0.0.5", "test CPU on 10.0.0.5")
    assert store.get_run(queued_run).status == RUNNING
    row = {"step": 1, "wall_time_s": 0.1, "loss": 2.0, "step_time_ms": 5.0, "phase": "warmup"}
    assert writer.push(queued_run, [row], [], ["a log line"]) is False
    writer.request_stop(queued_run)
    assert writer.push(queued_run, [], [], []) is True
    assert store.get_run(queued_run).steps_completed == 1
    with pytest.raises(ValueError, match="artifact name='../evil'"):
        writer.save_artifact(queued_run, "../evil", b"x")


# ---------------------------------------------------------------------------------------
# report: MLflow and TensorBoard availability


def test_an_mlflow_server_that_refuses_is_named_before_any_export(store):
    from engine.report.mlflow_export import (
        TrackingServerUnreachable,
        check_tracking_server,
        mlflow_problem,
    )

    assert mlflow_problem() is None  # CI installs the export extra
    with pytest.raises(TrackingServerUnreachable, match="127.0.0.1"):
        check_tracking_server(f"http://127.0.0.1:{_free_port()}", timeout_s=2)


def test_tensorboard_logdir_names_are_one_folder_per_run(store, queued_run):
    from engine.report.tensorboard_export import run_logdir_name, tensorboard_problem

    assert tensorboard_problem() is None
    name = run_logdir_name(store.get_run(queued_run))
    assert "/" not in name and queued_run in name
