"""A run's process tree ends with the run, whatever the run's status: every process a
workload starts in build() (os.fork, multiprocessing, Popen, a setsid'd Popen, a
double-forked daemon) is gone once the run's status is final, for a fresh trainer, a
standby's trainer, a workload that then fails, and a trainer killed mid-run (the
supervisor, a subreaper, ends what the trainer could not)."""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from engine.config import RunConfig
from engine.run.launcher import launch
from engine.schema import FINAL_STATUSES

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread_workers")]

FORKING_WORKLOAD = '''
import multiprocessing, os, subprocess, sys, time
import torch
from torch import nn
from engine.workloads import Workload

PIDS = {pids!r}


def _note(pid):
    with open(PIDS, "a") as handle:
        handle.write(f"{{pid}}\\n")


def _daemon():
    """fork, setsid, fork: the grandchild's parent exits at once (an orphan)."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            _note(os.getpid())
            time.sleep(300)
        os._exit(0)


def _children():
    pid = os.fork()
    if pid == 0:
        time.sleep(300)
        os._exit(0)
    _note(pid)
    proc = multiprocessing.get_context("fork").Process(target=time.sleep, args=(300,))
    proc.start()
    _note(proc.pid)
    _note(subprocess.Popen(["sleep", "300"]).pid)
    _note(subprocess.Popen(["sleep", "301"], start_new_session=True).pid)
    _daemon()


class Slow(nn.Linear):
    def forward(self, x):
        time.sleep({step_s})
        return super().forward(x)


def build(cfg):
    _children()
    if {fail!r}:
        raise RuntimeError("this workload fails after starting its children")
    return Workload(model=Slow(4, 3),
                    batches=lambda step: (torch.randn(cfg.batch_size, 4),
                                          torch.randint(0, 3, (cfg.batch_size,))))
'''


def _workload(tmp_path: Path, fail: bool = False, step_s: float = 0.0) -> tuple[Path, Path]:
    pids = tmp_path / "children.pids"
    path = tmp_path / "forking_workload.py"
    path.write_text(
        textwrap.dedent(FORKING_WORKLOAD.format(pids=str(pids), fail=fail, step_s=step_s))
    )
    return path, pids


def _children_of(pids: Path, wait_for) -> list[int]:
    wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 5, 30,
             message="the workload to start its 5 children")
    return [int(pid) for pid in pids.read_text().split()]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _final(store, run_id, wait_for, timeout_s=120.0):
    return wait_for(lambda: (run := store.get_run(run_id)).status in FINAL_STATUSES and run,
                    timeout_s, message=f"run {run_id} to end")


def _assert_none_alive(children: list[int]) -> None:
    # The status is recorded after the trainer ended them: at once, no grace.
    assert [pid for pid in children if _alive(pid)] == []


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fail", [False, True], ids=["finished", "failed"])
def test_a_fresh_trainers_workload_children_end_with_the_run(store, tmp_path, wait_for, fail):
    path, pids = _workload(tmp_path, fail=fail)
    run_id = launch(RunConfig(model="custom", workload=str(path), steps=5, batch_size=4,
                              profile=False, device="cpu"), store=store)
    run = _final(store, run_id, wait_for)
    assert run.status == ("failed" if fail else "finished"), run.reason
    _assert_none_alive(_children_of(pids, wait_for))
    log = (store.run_dir(run_id) / "worker.log").read_text()
    assert "process(es) the workload left running" in log


@pytest.mark.timeout(240)
def test_a_standby_trainers_workload_children_end_with_the_run(store, tmp_path, wait_for,
                                                              ready_standby):
    path, pids = _workload(tmp_path)
    run_id = launch(RunConfig(model="custom", workload=str(path), steps=5, batch_size=4,
                              profile=False, device="cpu"), store=store)
    run = _final(store, run_id, wait_for)
    assert run.status == "finished"
    _assert_none_alive(_children_of(pids, wait_for))
    assert "from the standby" in (store.run_dir(run_id) / "worker.log").read_text()
    # The supervisor leaves a successor standby as it exits: let it, then the fixture ends both.
    wait_for(lambda: not _alive(run.pid), 30, message="the supervisor to exit")


@pytest.mark.timeout(180)
def test_a_killed_trainers_workload_children_are_ended_by_the_supervisor(store, tmp_path,
                                                                        wait_for):
    path, pids = _workload(tmp_path, step_s=0.2)
    run_id = launch(RunConfig(model="custom", workload=str(path), steps=100_000, batch_size=4,
                              profile=False, device="cpu"), store=store)
    children = _children_of(pids, wait_for)
    trainer = wait_for(lambda: store.get_run(run_id).train_pid, 60, message="the trainer")
    wait_for(lambda: store.metrics_count(run_id) >= 1, 60, message="a first step")
    os.kill(trainer, signal.SIGKILL)
    run = _final(store, run_id, wait_for)
    assert run.status == "failed" and "signal 9" in run.reason
    _assert_none_alive(children)
    time.sleep(0.5)
    assert "leftover process(es)" in (store.run_dir(run_id) / "worker.log").read_text()
