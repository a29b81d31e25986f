"""A run's processes stay in reach whatever they do: a workload that double-forks a daemon
and execs it with an empty environment (no marks, another name, its own session) is
ended with the run, also after its supervisor and trainer are both SIGKILLed. Needs a
cgroup this user may make (engine doctor says whether this machine gives one); skipped
with the reason elsewhere."""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from engine.config import RunConfig
from engine.proc import RUN_CGROUP_FILE, run_cgroup_parent
from engine.run.launcher import launch, reconcile
from engine.schema import FAILED

ESCAPING_WORKLOAD = '''
import os, time
import torch
from torch import nn
from engine.workloads import Workload

PIDS = {pids!r}


def _escape():
    """fork, setsid, fork, exec with an empty environment: no run marks, not our name,
    no parent but init once the trainer is gone."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(PIDS, "a") as handle:
                handle.write(f"{{os.getpid()}}\\n")
            os.execve("/bin/sleep", ["sleep", "300"], {{}})
        os._exit(0)


class Slow(nn.Linear):
    def forward(self, x):
        time.sleep(0.2)
        return super().forward(x)


def build(cfg):
    _escape()
    return Workload(model=Slow(4, 3),
                    batches=lambda step: (torch.randn(cfg.batch_size, 4),
                                          torch.randint(0, 3, (cfg.batch_size,))))
'''


@pytest.fixture
def cgroup_allowed():
    parent, why = run_cgroup_parent()
    if parent is None:
        pytest.skip(f"this machine gives no cgroup for a run: {why}")
    return parent


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _escaping_run(store, tmp_path: Path, wait_for) -> tuple[str, int]:
    pids = tmp_path / "daemon.pid"
    path = tmp_path / "escaping_workload.py"
    path.write_text(textwrap.dedent(ESCAPING_WORKLOAD.format(pids=str(pids))))
    run_id = launch(RunConfig(model="custom", workload=str(path), steps=100_000, batch_size=4,
                              profile=False, device="cpu"), store=store)
    wait_for(lambda: pids.exists() and pids.read_text().strip(), 90, message="the daemon")
    wait_for(lambda: store.metrics_count(run_id) >= 1, 90, message="a first step")
    daemon = int(pids.read_text().split()[0])
    assert psutil.Process(daemon).environ() == {}  # no marks to find it by
    return run_id, daemon


def _kill_supervisor_and_trainer(store, run_id: str) -> None:
    run = store.get_run(run_id)
    for pid in (run.pid, run.train_pid):  # both at once: nobody left to reap the daemon
        os.kill(pid, signal.SIGKILL)


def _assert_daemon_ended_by_reconcile(store, run_id: str, daemon: int, wait_for) -> None:
    run = store.get_run(run_id)
    wait_for(lambda: not _alive(run.pid) and not _alive(run.train_pid), 10,
             message="the supervisor and the trainer to die")
    time.sleep(0.5)
    # Without the cgroup it lives on here, parent 1, for good.
    reconcile(store)
    assert store.get_run(run_id).status == FAILED
    wait_for(lambda: not _alive(daemon), 5, message=f"the daemon {daemon} to end")


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread_workers")
@pytest.mark.timeout(180)
def test_a_daemon_escaping_a_fresh_trainer_ends_when_supervisor_and_trainer_are_killed(
        store, tmp_path, wait_for, cgroup_allowed, monkeypatch):
    monkeypatch.setenv("PRECISION_LAB_STANDBY", "0")
    run_id, daemon = _escaping_run(store, tmp_path, wait_for)
    group = Path((store.run_dir(run_id) / RUN_CGROUP_FILE).read_text().strip())
    assert daemon in [int(p) for p in (group / "cgroup.procs").read_text().split()]
    _kill_supervisor_and_trainer(store, run_id)
    _assert_daemon_ended_by_reconcile(store, run_id, daemon, wait_for)
    assert not group.exists()


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread_workers")
@pytest.mark.timeout(240)
def test_a_daemon_escaping_a_standby_trainer_ends_when_supervisor_and_trainer_are_killed(
        store, tmp_path, wait_for, cgroup_allowed, ready_standby):
    run_id, daemon = _escaping_run(store, tmp_path, wait_for)
    assert "from the standby" in (store.run_dir(run_id) / "worker.log").read_text()
    _kill_supervisor_and_trainer(store, run_id)
    _assert_daemon_ended_by_reconcile(store, run_id, daemon, wait_for)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread_workers")
@pytest.mark.timeout(180)
def test_a_finished_run_leaves_no_process_and_no_cgroup(store, tmp_path, wait_for,
                                                         cgroup_allowed, monkeypatch):
    monkeypatch.setenv("PRECISION_LAB_STANDBY", "0")
    pids = tmp_path / "daemon.pid"
    path = tmp_path / "escaping_workload.py"
    path.write_text(textwrap.dedent(ESCAPING_WORKLOAD.format(pids=str(pids))))
    run_id = launch(RunConfig(model="custom", workload=str(path), steps=3, batch_size=4,
                              profile=False, device="cpu"), store=store)
    wait_for(lambda: store.get_run(run_id).status == "finished", 120, message="the run")
    daemon = int(pids.read_text().split()[0])
    assert not _alive(daemon)
    # The trainer records the status; the supervisor then ends the group and exits.
    supervisor = store.get_run(run_id).pid
    wait_for(lambda: not _alive(supervisor), 30, message="the supervisor to exit")
    group = Path((store.run_dir(run_id) / RUN_CGROUP_FILE).read_text().strip())
    assert not group.exists()


# -- engine doctor says whether runs get a cgroup here (fast: no process) ---------------------
def test_doctor_names_the_run_cgroup_this_machine_gives():
    from engine.diagnostics.doctor import run_cgroup_report

    parent, kind = run_cgroup_parent()
    report = run_cgroup_report()
    assert report["available"] is (parent is not None)
    assert report["line"].startswith("run cgroups: " + ("yes" if parent else "no"))
    assert kind in report["line"]


def test_doctor_says_what_escapes_where_no_cgroup_can_be_made(tmp_path, monkeypatch):
    from engine import proc
    from engine.diagnostics.doctor import run_cgroup_report

    mounts = tmp_path / "mounts"  # a machine whose /proc/self/mounts lists no cgroup
    mounts.write_text("proc /proc proc rw 0 0\ntmpfs /tmp tmpfs rw 0 0\n")
    monkeypatch.setattr(proc, "PROC_MOUNTS", mounts)
    report = run_cgroup_report()
    assert report["available"] is False
    assert "no cgroup v2 mount" in report["line"] and "no cgroup v1 freezer mount" in report["line"]
    assert "double-forks and clears its environment outlives" in report["line"]
    assert proc.make_run_cgroup(tmp_path / "run", "r1") is None
