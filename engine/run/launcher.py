"""Start, stop and reconcile background workers.

A run lives in its own process group (`start_new_session=True`): closing a browser tab
or restarting the Streamlit server neither kills nor duplicates it, and the UI finds it
again through the store. The stored pid plus the process's create time guard against
pid reuse when deciding whether a worker is still alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from engine.admission import check_runnable
from engine.config import RunConfig
from engine.proc import (
    PROJECT_ROOT,
    child_env,
    group_alive,
    is_alive,
    kill_if_ours,
    kill_processes_of_run,
    open_private_log,
    process_create_time,
    reap_when_done,
    signal_group,
)
from engine.run import standby
from engine.run.ranks import live_rank_pids, signal_rank_processes
from engine.run.ray_runs import driver_gone_reason, is_ray_run, stop_ray_run
from engine.schema import ACTIVE_STATUSES, FAILED, QUEUED, RUN_ID_ENV, RUNNING, STOPPED, WORKER_LOG
from engine.store import RunRecord, Store

STOP_GRACE_S = 3.0  # SIGTERM, then SIGKILL after this long: a stop finishes within ~5 s
_START_TIMEOUT_S = 60.0  # a run with no pid after this long never got a worker


def launch(config: RunConfig, store: Store | None = None) -> str:
    """Validate `config` against the device, record it as queued and start its worker."""
    store = store or Store()
    device, _warnings = check_runnable(config)
    run_id = store.create_run(config, device.key, device.name)
    start_worker(run_id, store)
    return run_id


def start_worker(run_id: str, store: Store) -> int:
    log_path = store.run_dir(run_id) / WORKER_LOG
    with open_private_log(log_path) as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine.run.worker", run_id],  # an argument list: no shell
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=str(PROJECT_ROOT), env={**child_env(store.home), RUN_ID_ENV: run_id},
            start_new_session=True, close_fds=True)
    store.update_run(run_id, pid=proc.pid, pid_create_time=process_create_time(proc.pid))
    reap_when_done(proc, "worker")
    return proc.pid


def reconcile(store: Store) -> list[str]:
    """Mark active runs whose worker is gone as failed; return their ids."""
    failed = []
    now = time.time()
    for run in store.list_runs(statuses=ACTIVE_STATUSES):
        if run.pid is None:
            if now - run.created_at > _START_TIMEOUT_S:
                reason = "worker never started (no process recorded); see worker.log"
                if store.set_status(run.id, FAILED, reason):
                    failed.append(run.id)
            continue
        if not is_alive(run.pid, run.pid_create_time):
            reason = (driver_gone_reason(store, run)
                      or f"worker process {run.pid} is gone without a final status "
                         f"(at step {run.steps_completed}); see worker.log")
            if store.set_status(run.id, FAILED, reason):
                failed.append(run.id)
            # Its trainer dies with the supervisor (PR_SET_PDEATHSIG); should one survive
            # anyway (another OS, a race), it is ended here: it trains for a failed run.
            kill_if_ours(run.train_pid, run.train_pid_create_time)
            kill_processes_of_run(store.home, run.id)  # what its workload started
            if run.config.nprocs > 1:  # ranks live in their own sessions: end them too
                _signal_run(store, run, signal.SIGKILL)
    if failed:
        standby.keep(store)  # a killed supervisor left no successor for the app
    return failed


def stop(run_id: str, store: Store | None = None, grace_s: float = STOP_GRACE_S) -> RunRecord:
    """SIGTERM the run's process group, SIGKILL it after `grace_s`; the run ends `stopped`."""
    store = store or Store()
    run = store.get_run(run_id)
    if not run.is_active:
        return run
    # Ray sweep runs: their pid is the sweep's driver, which must not be signalled: the stop
    # is requested through the store; the driver stops the Ray task, then force-cancels it
    # after a grace (engine/run/ray_runs.py).
    if is_ray_run(store, run_id):
        return stop_ray_run(run_id, store)
    if is_alive(run.pid, run.pid_create_time) or _ranks_alive(store, run):
        _signal_run(store, run, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _run_alive(store, run):
            time.sleep(0.05)
        if _run_alive(store, run):
            _signal_run(store, run, signal.SIGKILL)
            _wait_run_gone(store, run, timeout_s=2.0)
    store.set_status(run_id, STOPPED, f"stopped by request at step "
                                      f"{store.get_run(run_id).steps_completed}",
                     only_from=(QUEUED, RUNNING))
    # The supervisor leaves the app's standby itself, unless the stop had to kill it.
    standby.keep(store)
    return store.get_run(run_id)


# -- multi-process runs: torchrun starts each rank in its own session, outside the run's
# process group; engine/run/torchrun.py records them (pid + create time) for this.


def _ranks_alive(store: Store, run: RunRecord) -> bool:
    return run.config.nprocs > 1 and bool(live_rank_pids(store.run_dir(run.id)))


def _signal_run(store: Store, run: RunRecord, sig: int) -> None:
    """`sig` to the run's process group (supervisor, trainer or torchrun agent) and to
    every recorded rank of a multi-process run."""
    if is_alive(run.pid, run.pid_create_time):
        signal_group(run.pid, sig)
    if run.config.nprocs > 1:
        signal_rank_processes(store.run_dir(run.id), sig)


def _run_alive(store: Store, run: RunRecord) -> bool:
    return group_alive(run.pid) or _ranks_alive(store, run)


def _wait_run_gone(store: Store, run: RunRecord, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _run_alive(store, run):
        time.sleep(0.05)


def log_path(run_id: str, store: Store) -> Path:
    return store.run_dir(run_id) / WORKER_LOG


def read_log_tail(run_id: str, store: Store, max_bytes: int = 20_000) -> str:
    path = log_path(run_id, store)
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
