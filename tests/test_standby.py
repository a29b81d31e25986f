"""The pre-started trainer (engine/run/standby.py) with real processes: a run handed to a
standby trains and finishes like any other, its faults and stops are recorded the same
way, and the supervisor leaves a fresh standby behind for the next launch."""

from __future__ import annotations

import os
import signal
import socket
import time

import psutil
import pytest

from engine.config import RunConfig
from engine.run import standby
from engine.run.launcher import launch, log_path, stop
from engine.schema import ACTIVE_STATUSES, FAILED, FINISHED, STOPPED

pytestmark = pytest.mark.slow

READY_TIMEOUT_S = 60.0  # importing torch on a loaded 2-core machine


def _config(**changes) -> RunConfig:
    fields = dict(model="mlp", size="tiny", precision="fp32", batch_size=16, steps=20,
                  device="cpu", profile=False, warmup_steps=2)
    fields.update(changes)
    return RunConfig(**fields)


@pytest.fixture
def ready_standby(store, monkeypatch, wait_for):
    """A standby for this test's data directory, listening; shut down afterwards."""
    monkeypatch.setenv(standby.ENABLE_ENV, "1")
    standby.ensure(store)
    pid = wait_for(lambda: standby.ping(store.home), READY_TIMEOUT_S,
                   interval_s=0.2, message="the standby to listen")
    yield pid
    # A supervisor starts a successor standby when its run ends: let them all exit
    # first, or one could start a standby after this clean-up.
    for run in store.list_runs():
        if run.pid:
            wait_for(lambda: not _running(run.pid), 15, message=f"supervisor {run.pid} to exit")
    standby.shutdown(store.home)
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "engine.run.standby" in cmdline and str(store.home) in cmdline:
            proc.kill()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _ended(store, run_id: str):
    run = store.get_run(run_id)
    return run if run.status not in ACTIVE_STATUSES else None


def test_a_run_handed_to_the_standby_trains_and_a_new_standby_follows(store, ready_standby,
                                                                      wait_for):
    run_id = launch(_config(), store)
    run = wait_for(lambda: _ended(store, run_id), 60, message="the run to end")
    assert run.status == FINISHED, run.reason
    log = log_path(run_id, store).read_text()
    assert f"started by standby {ready_standby}" in log
    assert store.metrics_count(run_id) == 20
    assert run.summary["final_loss"] < run.summary["first_loss"]
    # One run per standby: the old one exited, the supervisor started its successor.
    wait_for(lambda: not _running(ready_standby), 20, message="the used standby to exit")
    successor = wait_for(lambda: standby.ping(store.home), READY_TIMEOUT_S, interval_s=0.2,
                         message="a successor standby")
    assert successor != ready_standby


def test_sigkill_of_a_standby_trainer_is_reported_as_for_a_fresh_one(store, ready_standby,
                                                                    wait_for):
    run_id = launch(_config(steps=100_000), store)
    wait_for(lambda: store.metrics_count(run_id) > 0, 60, message="the first metric row")
    train_pid = store.get_run(run_id).train_pid
    assert psutil.Process(train_pid).ppid() == ready_standby  # forked by the standby
    os.kill(train_pid, signal.SIGKILL)
    run = wait_for(lambda: _ended(store, run_id), 30, message="the run to end")
    assert run.status == FAILED
    assert "signal 9 (SIGKILL)" in run.reason


def test_stop_ends_a_standby_trainer(store, ready_standby, wait_for):
    run_id = launch(_config(steps=100_000), store)
    wait_for(lambda: store.metrics_count(run_id) > 0, 60, message="the first metric row")
    train_pid = store.get_run(run_id).train_pid
    started = time.monotonic()
    run = stop(run_id, store)
    assert run.status == STOPPED
    wait_for(lambda: not _running(train_pid), 10, message="the trainer to exit")
    assert time.monotonic() - started < 8.0


def test_supervisor_killed_takes_the_standby_trainer_with_it(store, ready_standby, wait_for):
    run_id = launch(_config(steps=100_000), store)
    wait_for(lambda: store.metrics_count(run_id) > 0, 60, message="the first metric row")
    run = store.get_run(run_id)
    os.kill(run.pid, signal.SIGKILL)  # the supervisor only: the trainer is not its child
    wait_for(lambda: not _running(run.train_pid), 10,
             message="the orphaned trainer to be killed by its standby")


def test_memory_capped_runs_start_a_fresh_trainer(store, ready_standby, wait_for):
    run_id = launch(_config(memory_cap_mb=4096), store)
    run = wait_for(lambda: _ended(store, run_id), 90, message="the run to end")
    assert run.status == FINISHED, run.reason
    assert "started by standby" not in log_path(run_id, store).read_text()
    assert standby.ping(store.home) == ready_standby  # still waiting for the next run


def test_the_standby_answers_only_valid_requests(store, ready_standby):
    for request in (b'{"run_id": "../../etc"}\n', b"not json\n", b'{"run_id": "x;rm -rf ~"}\n'):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(standby.socket_name(store.home))
        conn.sendall(request)
        conn.settimeout(5)
        assert conn.recv(100) == b""  # refused: closed without a pid
        conn.close()
    assert standby.ping(store.home) == ready_standby


def test_disabled_standby_is_neither_used_nor_started(store, monkeypatch):
    monkeypatch.setenv(standby.ENABLE_ENV, "0")
    assert standby.ensure(store) is None
    assert standby.hand_off("run-x", store.home) is None
    assert standby.ping(store.home) is None
