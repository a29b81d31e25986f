"""No trainer outlives its run, whatever dies: SIGKILL of the supervisor (fresh trainer, and
a trainer handed to the standby), SIGKILL of the standby right after the hand-off.
Within 5 s no process of the run remains, reconcile fails the run with the reason, and
no metric row is added after the final status."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from engine.config import RunConfig
from engine.proc import kill_if_ours, process_create_time
from engine.run import standby
from engine.run.launcher import launch, reconcile
from engine.schema import FAILED, RUNNING, STANDBY_LOG

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread_workers")]

LONG = RunConfig(model="mlp", batch_size=8, steps=1_000_000, profile=False, device="cpu")
GONE_WITHIN_S = 5.0


def _alive(pid: int | None) -> bool:
    try:
        return bool(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _training(store, run_id, wait_for):
    """The run once it has logged rows and recorded its trainer."""
    wait_for(lambda: store.metrics_count(run_id) >= 3 and store.get_run(run_id).train_pid, 90,
             message=f"run {run_id} to train")
    return store.get_run(run_id)


def _assert_run_ends_with_no_process_and_no_late_rows(store, run_id, pids, wait_for):
    wait_for(lambda: not any(_alive(pid) for pid in pids), GONE_WITHIN_S,
             message=lambda: f"the run's processes to go: {[p for p in pids if _alive(p)]}")
    reconcile(store)
    run = store.get_run(run_id)
    assert run.status == FAILED and "gone without a final status" in run.reason, run.reason
    rows_at_final = store.metrics_count(run_id)
    time.sleep(1.5)  # longer than a metric flush interval
    assert store.metrics_count(run_id) == rows_at_final, "rows written after the final status"


@pytest.fixture
def no_standby(monkeypatch):
    monkeypatch.setenv(standby.ENABLE_ENV, "0")


@pytest.mark.timeout(150)
def test_sigkill_of_the_supervisor_ends_its_fresh_trainer(store, wait_for, no_standby):
    run_id = launch(LONG, store)
    run = _training(store, run_id, wait_for)
    assert run.train_pid != run.pid and run.train_pid_create_time is not None
    os.kill(run.pid, signal.SIGKILL)
    _assert_run_ends_with_no_process_and_no_late_rows(store, run_id, [run.pid, run.train_pid],
                                                      wait_for)


@pytest.mark.timeout(150)
def test_sigkill_of_the_supervisor_ends_a_memory_capped_trainer(store, wait_for, no_standby):
    run_id = launch(LONG.replace(memory_cap_mb=4096), store)
    run = _training(store, run_id, wait_for)
    os.kill(run.pid, signal.SIGKILL)
    _assert_run_ends_with_no_process_and_no_late_rows(store, run_id, [run.pid, run.train_pid],
                                                      wait_for)


@pytest.mark.timeout(180)
def test_sigkill_of_the_supervisor_ends_the_standbys_trainer(store, wait_for, ready_standby):
    run_id = launch(LONG, store)
    run = _training(store, run_id, wait_for)
    assert psutil.Process(run.train_pid).ppid() == ready_standby  # the forked trainer
    os.kill(run.pid, signal.SIGKILL)
    _assert_run_ends_with_no_process_and_no_late_rows(
        store, run_id, [run.pid, run.train_pid, ready_standby], wait_for)


@pytest.mark.timeout(180)
def test_sigkill_of_the_standby_after_the_hand_off_ends_its_trainer(store, wait_for,
                                                                    ready_standby):
    run_id = launch(LONG, store)
    run = _training(store, run_id, wait_for)
    os.kill(ready_standby, signal.SIGKILL)
    wait_for(lambda: not _alive(run.train_pid), GONE_WITHIN_S,
             message="the standby's trainer to die with it")
    # The supervisor records how its trainer ended, and leaves no process behind.
    wait_for(lambda: store.get_run(run_id).status != RUNNING, 10, message="the run to end")
    run = store.get_run(run_id)
    assert run.status == FAILED and "signal 9" in run.reason, run.reason
    wait_for(lambda: not _alive(run.pid), GONE_WITHIN_S, message="the supervisor to exit")
    rows_at_final = store.metrics_count(run_id)
    time.sleep(1.5)
    assert store.metrics_count(run_id) == rows_at_final


def test_kill_if_ours_never_signals_a_process_with_another_create_time():
    pid = os.getpid()
    created = process_create_time(pid)
    assert not kill_if_ours(pid, created - 100.0)  # "our" trainer was another process
    assert not kill_if_ours(None, created)
    assert not kill_if_ours(pid, None)


# ---------------------------------------------------------------------------------------
# one trainer per run: the claim


def test_the_store_takes_rows_only_from_the_trainer_that_claimed_the_run(store):
    from engine.store import ClaimLost

    run_id = store.create_run(LONG, "cpu")
    assert not store.claim_trainer(run_id, "a")  # queued: nobody trains it yet
    store.set_status(run_id, RUNNING)
    assert store.claim_trainer(run_id, "a")
    assert not store.claim_trainer(run_id, "b")  # claimed once
    row = {"step": 1, "loss": 1.0, "wall_time_s": 0.1}
    for intruder in ("b", None):
        with pytest.raises(ClaimLost):
            store.write_metrics(run_id, [row], token=intruder)
    assert store.metrics_count(run_id) == 0
    store.write_metrics(run_id, [row], token="a")
    assert store.metrics_count(run_id) == 1 and store.holds_claim(run_id, "a")


@pytest.mark.timeout(150)
def test_a_second_trainer_for_a_running_run_does_not_train(store, wait_for, no_standby):
    import subprocess
    import sys

    from engine.proc import PROJECT_ROOT, child_env

    run_id = launch(LONG, store)
    run = _training(store, run_id, wait_for)
    second = subprocess.run([sys.executable, "-m", "engine.run.worker", "--train", run_id],
                            cwd=str(PROJECT_ROOT), env=child_env(store.home),
                            capture_output=True, text=True, timeout=90)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "already claimed by another trainer; not training" in second.stdout
    frame = store.read_metrics(run_id, max_points=None)
    assert frame["wall_time_s"].is_monotonic_increasing  # one trainer's clock, not two
    assert store.get_run(run_id).status == RUNNING and _alive(run.train_pid)


@pytest.mark.timeout(240)
def test_a_standby_stalled_past_the_hand_off_never_trains_the_run_twice(store, wait_for,
                                                                        ready_standby):
    os.kill(ready_standby, signal.SIGSTOP)  # longer than hand_off's 10 s wait
    try:
        run_id = launch(LONG.replace(steps=400), store)
        wait_for(lambda: store.metrics_count(run_id) >= 3, 90,
                 message="the fresh trainer the supervisor started instead")
        time.sleep(1.0)
    finally:
        os.kill(ready_standby, signal.SIGCONT)
    wait_for(lambda: not store.get_run(run_id).is_active, 120, message="the run to end")
    run = store.get_run(run_id)
    frame = store.read_metrics(run_id, max_points=None)
    assert run.status == "finished", run.reason
    assert frame["step"].tolist() == list(range(1, 401))
    assert frame["wall_time_s"].is_monotonic_increasing  # never two trainers' rows mixed
    log = (store.run_dir(run_id) / "worker.log").read_text()
    assert log.count("finished after") == 1, log[-3000:]
    # The resumed standby finds the supervisor gone and says so in one line, not a
    # BrokenPipeError traceback, and ends (it forked no trainer for nobody).
    standby_log = store.home / STANDBY_LOG
    wait_for(lambda: "stopped waiting for the hand-off" in standby_log.read_text(), 30,
             message=lambda: f"the standby's line; its log: {standby_log.read_text()[-2000:]}")
    assert "Traceback" not in standby_log.read_text(), standby_log.read_text()[-3000:]
    wait_for(lambda: not psutil.pid_exists(ready_standby)
             or psutil.Process(ready_standby).status() == psutil.STATUS_ZOMBIE, 30,
             message="the stalled standby to exit")


@pytest.mark.timeout(150)
def test_a_finished_runs_supervisor_is_reaped_by_the_process_that_launched_it(store, wait_for,
                                                                               no_standby):
    """The Streamlit server launches supervisors and never waits for them: without a reaper
    each ended one stays a zombie under it (seen: every finished run's supervisor)."""
    run_id = launch(RunConfig(model="mlp", size="tiny", steps=5, profile=False, device="cpu"),
                    store=store)
    wait_for(lambda: store.get_run(run_id).pid, 30, message="the supervisor's pid")
    pid = store.get_run(run_id).pid
    wait_for(lambda: store.get_run(run_id).status == "finished", 90, message=f"run {run_id} to end")

    def reaped() -> bool:  # a zombie is still a process: only a reaped pid is gone
        return not psutil.pid_exists(pid)

    wait_for(reaped, 10, message=lambda: f"supervisor {pid} to be reaped, not left a zombie")
    zombies = [child.pid for child in psutil.Process().children()
               if child.status() == psutil.STATUS_ZOMBIE]
    assert zombies == []
