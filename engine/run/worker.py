"""`python -m engine.run.worker RUN_ID`: the process a run lives in.

Two processes per run, one process group:
  - the supervisor (this module's `supervise`) waits for the run's device (FIFO, one
    run per device), starts the training process, and records how it ended even when
    it was killed (a signal, an OOM kill): a run never stays "running" by accident.
    It does not import torch, so queued runs cost almost nothing.
  - the trainer (`--train`, or forked by the standby) runs engine.run.session: imports
    torch, trains, and flushes metrics to the store at least every 0.5 s.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from engine.proc import (
    become_subreaper,
    cgroup_oom_kills,
    child_setup,
    end_descendants,
    is_standby,
    kill_processes_of_run,
    make_run_cgroup,
    memory_cap,
    process_create_time,
    sigkill_cause,
    signal_name,
    storage_problem_in,
)
from engine.run import standby
from engine.run.launcher import read_log_tail, reconcile
from engine.run.session import StopFlag
from engine.run.torchrun import supervise_distributed
from engine.run.watch import RunWatch
from engine.schema import ACTIVE_STATUSES, FAILED, QUEUED, STOPPED
from engine.store import Store

QUEUE_POLL_S = 0.2


# ---------------------------------------------------------------------------------------
# supervisor


def supervise(run_id: str, store: Store) -> int:
    stop = StopFlag()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        return _supervise(run_id, store, stop)
    finally:
        # Every ending leaves the app's standby in place: the next launch from the app
        # must find a trainer with torch loaded, after a stop and a failure too.
        standby.keep(store)


def _supervise(run_id: str, store: Store, stop: StopFlag) -> int:
    become_subreaper()  # a trainer that dies abruptly hands its workload's children to us
    store.update_run(run_id, pid=os.getpid(), pid_create_time=process_create_time(os.getpid()))
    config_error = store.get_run(run_id).config_error
    if config_error:  # never train defaults in place of a config that does not parse
        store.set_status(run_id, FAILED, f"{config_error}; re-launch the run with a valid config")
        return 0
    print(f"[supervisor] run {run_id}: waiting for device", flush=True)
    while not store.claim_device(run_id):
        if stop.requested:
            store.set_status(run_id, STOPPED, "stopped while queued", only_from=(QUEUED,))
            return 0
        if store.get_run(run_id).status != QUEUED:
            return 0  # someone else decided its fate (stopped from the UI, reconciled)
        reconcile(store)  # a dead run must not hold the device forever
        time.sleep(QUEUE_POLL_S)
    run = store.get_run(run_id)
    if run.config.nprocs > 1:  # torchrun and its ranks: engine/run/torchrun.py
        supervise_distributed(run, store, stop, memory_cap(
            run.config.memory_cap_mb if run.device_key == "cpu" else 0))
        _end_leftovers(store, run_id)
        return 0
    print(f"[supervisor] run {run_id}: device {run.device_key} claimed, starting trainer",
          flush=True)
    oom_kills_before = cgroup_oom_kills()
    child = _start_trainer(run_id, run, store)
    store.update_run(run_id, train_pid=child.pid,
                     train_pid_create_time=process_create_time(child.pid))
    used_standby = isinstance(child, standby.StandbyTrainer)
    watch = RunWatch(store, run_id)
    return_code = _wait_child(child, stop, on_stop=lambda: standby.keep(store),
                              on_tick=watch.tick)
    watch.close()
    # before the status: a run that has ended has no process left
    _end_leftovers(store, run_id)
    _record_exit(store, run_id, return_code, stop.requested, oom_kills_before)
    if used_standby:
        # This run used up a standby that someone started (the app, `engine standby
        # start`): leave its successor. A run from a terminal with no standby leaves no
        # daemon behind.
        _replace_standby(store)
    return 0


def _end_leftovers(store: Store, run_id: str) -> None:
    """End what the trainer left (it ends its workload's processes itself, unless it was
    killed): this process's descendants but the app's standby, and what carries the run's
    marks (engine.proc.processes_of_run)."""
    leftovers = end_descendants(spare=is_standby)
    others = kill_processes_of_run(store.home, run_id)
    if leftovers or others:
        print(f"[supervisor] run {run_id}: ended {len(leftovers) + others} leftover "
              f"process(es) {', '.join(leftovers[:10])}", flush=True)


def _start_trainer(run_id: str, run, store: Store):
    """The pre-started standby trainer when one is ready (PyTorch already imported: the
    first point comes ~3.5 s sooner on a 2-core CPU), else a fresh process.

    Memory-capped runs always start fresh: RLIMIT_AS must be set before PyTorch maps.
    """
    cap_mb = run.config.memory_cap_mb if run.device_key == "cpu" else 0
    # The trainer and all it starts go into the run's cgroup (a standby's forked trainer
    # joins it itself): ended as a whole at the end, or by reconcile if this process dies.
    group = make_run_cgroup(store.run_dir(run_id), run_id)
    if not cap_mb:
        trainer = standby.hand_off(run_id, store.home)
        if trainer is not None:
            print(f"[supervisor] run {run_id}: trainer pid {trainer.pid} from the standby",
                  flush=True)
            return trainer
    # The trainer dies with this supervisor (a SIGKILLed supervisor must not leave it
    # training into a run that reconcile marks failed).
    return subprocess.Popen([sys.executable, "-m", "engine.run.worker", "--train", run_id],
                            preexec_fn=child_setup(os.getpid(), cap_mb, group))


def _replace_standby(store: Store) -> None:
    """Keep one standby ready for the next launch; started after the run, not beside it.
    None when the app that wanted standbys has stopped meanwhile: nobody would use it."""
    if standby.app_gone(store.home):
        print("[supervisor] the app's server has ended: no successor standby", flush=True)
        return
    try:
        standby.ensure(store)
    except OSError as exc:  # the run's outcome is recorded; a standby is an optimisation
        print(f"[supervisor] no standby started: {exc}", flush=True)


def _wait_child(child, stop: StopFlag, on_stop=lambda: None, on_tick=lambda: None) -> int:
    """`child`: a subprocess.Popen or a standby.StandbyTrainer (same wait/signal API).
    `on_stop()` runs once, right after a stop is forwarded (the successor standby starts
    its imports then, while the trainer winds down: the stop may end in SIGKILL);
    `on_tick()` every 0.1 s (the log cap and the stall warning)."""
    forwarded_at = None
    while True:
        try:
            return child.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
        on_tick()
        if stop.requested and forwarded_at is None:
            forwarded_at = time.monotonic()
            child.send_signal(signal.SIGTERM)  # already sent to the group; harmless twice
            on_stop()
        if forwarded_at is not None and time.monotonic() - forwarded_at > 2.5:
            child.kill()


def _record_exit(store: Store, run_id: str, return_code: int, stop_requested: bool,
                 oom_kills_before: int | None = None) -> None:
    """The trainer writes its own final status; this covers the ways it can fail to, in
    words from evidence: the OOM killer only when the cgroup says so, a full disk when the
    trainer's last output says so."""
    run = store.get_run(run_id)
    if run.status not in ACTIVE_STATUSES:
        return
    step = run.steps_completed
    if stop_requested:
        store.set_status(run_id, STOPPED, f"stopped by request at step {step}")
    elif return_code < 0:
        sig = -return_code
        hint = sigkill_cause(oom_kills_before) if sig == signal.SIGKILL else ""
        store.set_status(run_id, FAILED, f"worker exited with signal {sig} ({signal_name(sig)}) "
                                         f"at step {step}{hint}")
    else:
        storage = storage_problem_in(read_log_tail(run_id, store, 4000))
        store.set_status(run_id, FAILED, f"worker exited with code {return_code} at step {step}"
                         + (f": {storage}" if storage else "; see worker.log"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.run.worker")
    parser.add_argument("run_id")
    parser.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    store = Store()
    if args.train:
        from engine.run.session import run_trainer  # fresh trainer process: imports torch

        return run_trainer(args.run_id, store)
    return supervise(args.run_id, store)


if __name__ == "__main__":
    sys.exit(main())
