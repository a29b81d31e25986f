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

from .config import RunConfig
from .store import ACTIVE_STATUSES, FAILED, QUEUED, RUNNING, STOPPED, RunRecord, Store

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STOP_GRACE_S = 3.0  # SIGTERM, then SIGKILL after this long: a stop finishes within ~5 s
WORKER_LOG = "worker.log"
_START_TIMEOUT_S = 60.0  # a run with no pid after this long never got a worker


def launch(config: RunConfig, store: Store | None = None) -> str:
    """Validate `config` against the device, record it as queued and start its worker."""
    from .devices import check_runnable

    store = store or Store()
    device, _warnings = check_runnable(config)
    run_id = store.create_run(config, device.key, device.name)
    start_worker(run_id, store)
    return run_id


def start_worker(run_id: str, store: Store) -> int:
    log_path = store.run_dir(run_id) / WORKER_LOG
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine.worker", run_id],  # an argument list: no shell
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=str(PROJECT_ROOT), env=worker_env(store), start_new_session=True,
            close_fds=True)
    store.update_run(run_id, pid=proc.pid, pid_create_time=process_create_time(proc.pid))
    return proc.pid


def worker_env(store: Store) -> dict[str, str]:
    """The environment of the processes a run uses (worker, standby trainer)."""
    env = dict(os.environ)
    env["PRECISION_LAB_HOME"] = str(store.home)
    # The worker imports `engine` from this checkout whatever the caller's cwd is.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def process_create_time(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:
        return None


def is_alive(pid: int | None, create_time: float | None) -> bool:
    """True when `pid` runs and is the process we started (same create time)."""
    if not pid:
        return False
    try:
        import psutil

        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if create_time is not None and abs(proc.create_time() - create_time) > 1.0:
            return False  # the pid was reused by another process
        return True
    except Exception:  # NoSuchProcess, AccessDenied on a foreign pid: not ours
        return False


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
            reason = (_ray_driver_gone_reason(store, run)
                      or f"worker process {run.pid} is gone without a final status "
                         f"(at step {run.steps_completed}); see worker.log")
            if store.set_status(run.id, FAILED, reason):
                failed.append(run.id)
            if run.config.nprocs > 1:  # ranks live in their own sessions: end them too
                _signal_run(store, run, signal.SIGKILL)
    return failed


def _ray_driver_gone_reason(store: Store, run: RunRecord) -> str | None:
    """A Ray sweep run's pid is its driver's (engine/ray_driver.py): say so when it died."""
    from .ray_driver import driver_gone_reason

    return driver_gone_reason(store, run)


def stop(run_id: str, store: Store | None = None, grace_s: float = STOP_GRACE_S) -> RunRecord:
    """SIGTERM the run's process group, SIGKILL it after `grace_s`; the run ends `stopped`."""
    store = store or Store()
    run = store.get_run(run_id)
    if not run.is_active:
        return run
    # -- Ray sweep runs (engine/ray_driver.py) ----------------------------------------------
    # Their pid is the sweep's driver, which must not be signalled: the stop is requested
    # through the store; the driver stops the Ray task, then force-cancels it after a grace.
    from .ray_driver import is_ray_run, stop_ray_run

    if is_ray_run(store, run_id):
        return stop_ray_run(run_id, store)
    # -- end of Ray sweep runs ---------------------------------------------------------------
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
    return store.get_run(run_id)


# -- multi-process runs: torchrun starts each rank in its own session, outside the run's
# process group; engine/distributed.py records them (pid + create time) for this.


def _ranks_alive(store: Store, run: RunRecord) -> bool:
    from .distributed import live_rank_pids

    return run.config.nprocs > 1 and bool(live_rank_pids(store.run_dir(run.id)))


def _signal_run(store: Store, run: RunRecord, sig: int) -> None:
    """`sig` to the run's process group (supervisor, trainer or torchrun agent) and to
    every recorded rank of a multi-process run."""
    if is_alive(run.pid, run.pid_create_time):
        _signal_group(run.pid, sig)
    if run.config.nprocs > 1:
        from .distributed import signal_rank_processes

        signal_rank_processes(store.run_dir(run.id), sig)


def _run_alive(store: Store, run: RunRecord) -> bool:
    return _group_alive(run.pid) or _ranks_alive(store, run)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        import psutil

        for proc in psutil.process_iter(["pid", "status"]):
            try:
                if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.info["pid"]) == pgid:
                    return True
            except (ProcessLookupError, PermissionError, OSError):
                continue
        return False
    except ImportError:  # pragma: no cover - psutil is a requirement
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False


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
