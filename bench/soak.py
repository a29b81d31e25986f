"""Soak: short runs with random SIGKILLs of the supervisor, the standby or the trainer.

    python -m bench.soak [--runs 30] [--seed 0] [--forking] [--json]

Each run (mlp-tiny, CPU, one thread) is launched as the app launches it, with a standby trainer
ready when one is; after a random 0.3-2.5 s one of its processes is SIGKILLed (or none,
one run in five). Then, after every run has ended:
  - no process of the soak is left (supervisors, trainers, standbys, by data directory);
  - no run is left queued or running (reconcile fails the dead ones with a reason);
  - no metric row was added after a run's final status (counted at the final status and
    again at the end);
  - no run holds rows of two trainers (wall_time_s rises with the step).
With --forking each run's workload starts children in build() (an os.fork, a setsid'd
Popen and a double-forked daemon), which must be gone too. Exit 0 when every check holds. The last
stdout line with --json is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import psutil

VICTIMS = ("supervisor", "trainer", "standby", "none")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--forking", action="store_true",
                        help="workloads that start child processes in build()")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="precision-lab-soak-") as tmp:
        os.environ["PRECISION_LAB_HOME"] = str(Path(tmp) / "home")
        os.environ["PRECISION_LAB_STANDBY"] = "1"
        # One thread per trainer: the soak checks process hygiene, not speed, and under a
        # hog torch's 2 threads wait in OpenMP barriers for the preempted one (a 3000-step
        # run took ~3 min instead of ~15 s), so runs outlived every bound on their status.
        os.environ["OMP_NUM_THREADS"] = "1"
        workload = _forking_workload(Path(tmp)) if args.forking else None
        result = soak(Path(tmp) / "home", args.runs, random.Random(args.seed), workload)
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0 if result["ok"] else 1


FORKING_WORKLOAD = '''
"""A workload whose build() leaves processes behind unless the run ends them."""
import os, subprocess, time
import torch
from torch import nn
from engine.workloads import Workload


def build(cfg):
    if os.fork() == 0:
        time.sleep(600)
        os._exit(0)
    subprocess.Popen(["sleep", "600"], start_new_session=True)
    if os.fork() == 0:  # a daemon: fork, setsid, fork, the middle one exits
        os.setsid()
        if os.fork() == 0:
            time.sleep(600)
        os._exit(0)
    return Workload(model=nn.Linear(16, 4),
                    batches=lambda step: (torch.randn(cfg.batch_size, 16),
                                          torch.randint(0, 4, (cfg.batch_size,))))
'''


def _forking_workload(folder: Path) -> Path:
    path = folder / "forking_workload.py"
    path.write_text(FORKING_WORKLOAD)
    return path


def _processes_of(home: Path) -> list[psutil.Process]:
    """Every live process whose command line or environment names this data directory."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
            continue
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if str(home) in cmdline or proc.environ().get("PRECISION_LAB_HOME") == str(home):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _standby_of(run) -> int | None:
    """The standby that forked this run's trainer (it stops listening after a hand-off)."""
    try:
        parent = psutil.Process(run.train_pid).ppid() if run.train_pid else None
    except psutil.Error:
        return None
    return parent if parent and parent != run.pid else None


def _wait(predicate, timeout_s: float, poll_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return False


FINAL_STATUS_WAIT_S = 60.0  # on a quiet machine; scaled by the load per core, at most 5x


def _final_status_bound_s() -> float:
    """How long to wait for a run's final status: longer on a loaded machine (a trainer
    preempted by a hog takes longer to flush and finalize), never unbounded."""
    try:
        load_per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        load_per_core = 1.0
    return FINAL_STATUS_WAIT_S * min(5.0, max(1.0, load_per_core))


def soak(home: Path, runs: int, rng: random.Random, workload: Path | None = None) -> dict:
    from engine.config import RunConfig
    from engine.run import standby
    from engine.run.launcher import launch, reconcile
    from engine.schema import ACTIVE_STATUSES
    from engine.store import Store

    store = Store(home)
    cfg = RunConfig(model="mlp", size="tiny", batch_size=8, steps=3000, profile=False,
                    device="cpu", warmup_steps=1)
    if workload is not None:
        cfg = cfg.replace(model="custom", workload=str(workload))
    killed: dict[str, int] = {victim: 0 for victim in VICTIMS}
    rows_at_final: dict[str, int] = {}
    not_ended: list[str] = []
    started = time.monotonic()
    for _ in range(runs):
        standby.ensure(store)  # the app keeps one ready
        _wait(lambda: standby.ping(home) is not None, 30)
        run_id = launch(cfg, store)
        _wait(lambda: store.get_run(run_id).train_pid is not None, 60)
        time.sleep(rng.uniform(0.3, 2.5))
        victim = rng.choice(VICTIMS)
        run = store.get_run(run_id)
        pid = {"supervisor": run.pid, "trainer": run.train_pid,
               "standby": _standby_of(run) or standby.ping(home)}.get(victim)
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
                killed[victim] += 1
            except ProcessLookupError:
                pass
        # The run ends by itself, or reconcile fails it; then nothing of it may remain.
        # Rows are counted only once its final status is recorded (a run still queued or
        # running has rows to come); the wait grows with the machine's load.
        ended = _wait(lambda: (reconcile(store) or True)
                      and store.get_run(run_id).status not in ACTIVE_STATUSES,
                      _final_status_bound_s(), poll_s=0.3)
        if not ended:
            not_ended.append(run_id)
            continue
        rows_at_final[run_id] = store.metrics_count(run_id)
        for proc in (run.pid, run.train_pid):
            if proc:
                _wait(lambda p=proc: not psutil.pid_exists(p)
                      or psutil.Process(p).status() == psutil.STATUS_ZOMBIE, 5)
    # The last supervisor may be starting a successor standby (it binds its socket once
    # torch is imported): ask until none is left. A standby is the app's, not an orphan.
    _wait(lambda: (standby.shutdown(home) or True) and not _processes_of(home), 30, poll_s=0.5)
    time.sleep(1.5)  # longer than a metric flush: rows written after the end would show
    reconcile(store)
    leftovers = [f"{p.pid} {' '.join(p.cmdline()[:4])}" for p in _processes_of(home)]
    for proc in _processes_of(home):
        proc.kill()  # leave the machine clean even when the soak found a defect
    active = [r.id for r in store.list_runs() if r.is_active]
    late_rows = {run_id: store.metrics_count(run_id) - count
                 for run_id, count in rows_at_final.items()
                 if store.metrics_count(run_id) != count}
    mixed = []
    for run_id in rows_at_final:
        frame = store.read_metrics(run_id, max_points=None, columns=["step", "wall_time_s"])
        if len(frame) and not frame["wall_time_s"].is_monotonic_increasing:
            mixed.append(run_id)
    ok = not leftovers and not active and not late_rows and not mixed and not not_ended
    return {"benchmark": "soak", "ok": ok, "runs": runs, "forking": workload is not None,
            "killed": killed,
            "runs_without_final_status": not_ended,
            "orphan_processes": leftovers, "runs_left_active": active,
            "rows_after_final_status": late_rows, "runs_with_two_trainers": mixed,
            "elapsed_s": round(time.monotonic() - started, 1)}


if __name__ == "__main__":
    sys.exit(main())
