"""`python -m engine.cluster.ray_driver SWEEP_ID`: runs a sweep's runs as Ray tasks and records
them in this machine's store, live.

Design, and why:
- One driver process per Ray sweep, started like a run's worker (own session, output in
  `sweeps/<id>/driver.log` under the data directory). Its pid is recorded as the pid of
  every run of the sweep: when the driver dies, `launcher.reconcile` fails its active
  runs with a reason naming the driver (Ray ends a driver's tasks and actors with it).
- Each run is one Ray task (`engine.cluster.ray_tasks.execute_run`) asking for `gpus_per_run`
  GPUs on a cluster that has GPUs, else `cpus_per_run` CPUs; Ray places it on any node.
  `max_retries=0`: a retried training run would mix two attempts' metrics in one run.
- The code reaches the nodes through `runtime_env={"py_modules": [<engine package>]}`;
  nodes need the same torch and requirements.txt installed (README).
- Results come back through one actor, `StoreWriter`, pinned with
  `NodeAffinitySchedulingStrategy(node_id=<driver's node>, soft=False)`, i.e. next to the
  database file. An actor rather than the driver receiving rows: a task can push rows
  the moment it has them (an object ref only delivers a task's return value at its end),
  and the actor executes one call at a time, so the whole cluster has exactly one SQLite
  writer, on the machine whose disk holds the database (SQLite must never be written
  over a network file system). Tasks batch metrics, telemetry and log lines into one
  call at most every 0.5 s from a thread (the training loop never waits on the network);
  the call's reply is the run's stop flag. The kernel analysis runs on the node (the CPU
  evidence depends on that node's ISA) and its results, the trace and the oneDNN log
  travel through the actor into `runs/<id>/`, where the Kernels page finds them.
- Stop: `launcher.stop` / `sweep.stop_sweep` record a stop request in the store (a run
  Ray has not started yet is marked stopped at once). The driver polls the requests
  every 0.5 s and sets the actor's stop flag; the task stops at its next step and ends
  the run `stopped`, as a SIGTERM'd local trainer does. A task that has not ended
  `stop_grace_s` later is force-cancelled (`ray.cancel(ref, force=True)` kills its
  worker process) and the driver records the run stopped; a pending task is cancelled
  at once. SIGTERM to the driver stops the whole sweep the same way.
- The driver writes only what the actor cannot: sweep status, runs whose task died or
  was cancelled, runs that could not start (cluster unreachable, resources the cluster
  does not have). Driver and actor are two writer processes on one machine, which SQLite
  in WAL mode handles like the local workers.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from engine.cluster.ray_env import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_STOP_GRACE_S, ray_problem
from engine.cluster.ray_tasks import StoreWriter, execute_run
from engine.proc import PROJECT_ROOT
from engine.run.finalize import finalize_run_data
from engine.schema import (
    DRIVER_LOG,
    FAILED,
    OOM,
    QUEUED,
    STOPPED,
    SWEEP_DONE,
)
from engine.store import Store, SweepRecord

ENGINE_DIR = PROJECT_ROOT / "engine"  # shipped to the nodes as a py_module
POLL_S = 0.5
RAY_NAMESPACE = "precision-lab"


# ---------------------------------------------------------------------------------------
# the driver process


class _Signalled:
    def __init__(self) -> None:
        self.stop_all = False

    def __call__(self, *_args) -> None:
        self.stop_all = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.cluster.ray_driver")
    parser.add_argument("sweep_id")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # task output lands in a log file, not a tty
    store = Store()
    sweep = store.get_sweep(args.sweep_id)
    signalled = _Signalled()
    signal.signal(signal.SIGTERM, signalled)
    signal.signal(signal.SIGINT, signalled)
    _say(f"sweep {sweep.id}: {len(sweep.run_ids)} runs on the Ray cluster at {sweep.ray_address}")
    try:
        return drive(store, sweep, signalled)
    except Exception as exc:  # noqa: BLE001 - every run must end with a reason
        traceback.print_exc()
        fail_sweep(store, sweep, f"the Ray sweep driver failed: {type(exc).__name__}: {exc}")
        return 1
    except (SystemExit, KeyboardInterrupt):  # terminated while joining the cluster
        for run in map(store.get_run, sweep.run_ids):
            store.set_status(run.id, STOPPED, f"stopped at step {run.steps_completed}: the "
                                              "sweep's Ray driver was terminated")
        raise


def drive(store: Store, sweep: SweepRecord, signalled: _Signalled) -> int:
    problem = ray_problem(sweep.ray_address or "")
    if problem:
        fail_sweep(store, sweep, problem)
        return 1
    import ray

    connected = _connect_watchdog(store, sweep)
    try:
        connect(ray, sweep.ray_address)
    except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, version mismatch
        traceback.print_exc()
        fail_sweep(store, sweep, f"could not join the Ray cluster at {sweep.ray_address}: "
                                 f"{_first_line(exc)}; see sweeps/{sweep.id}/{DRIVER_LOG}")
        return 1
    connected.set()
    # ray.init replaced our SIGTERM handler with sys.exit; stopping every run is gentler.
    signal.signal(signal.SIGTERM, signalled)
    try:
        resources = task_resources(ray, sweep.options)
        if isinstance(resources, str):
            fail_sweep(store, sweep, resources)
            return 1
        writer = start_writer(ray, store)
        tasks = submit(ray, store, sweep, writer, resources)
        supervise(ray, store, sweep, writer, tasks, signalled)
    finally:
        ray.shutdown()
    store.set_sweep_status(sweep.id, SWEEP_DONE)
    _say(f"sweep {sweep.id}: done")
    return 0


def _connect_watchdog(store: Store, sweep: SweepRecord) -> threading.Event:
    """Fail the sweep and end this process when the cluster has not answered in time:
    ray.init keeps retrying for many minutes against a port that is not a Ray head."""
    timeout_s = float(sweep.options.get("connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S))
    connected = threading.Event()

    def watch() -> None:
        if not connected.wait(timeout_s):
            fail_sweep(store, sweep, f"no Ray cluster answered at {sweep.ray_address} within "
                                     f"{timeout_s:g} s: check that it is the head's HOST:PORT "
                                     "(`ray start --head --port PORT`) and that this machine "
                                     "is a node of the cluster (README: Sweeps)")
            os._exit(1)  # ray.init cannot be interrupted from another thread

    threading.Thread(target=watch, name="connect-watchdog", daemon=True).start()
    return connected


def connect(ray, address: str) -> None:
    ray.init(address=address, namespace=RAY_NAMESPACE, log_to_driver=True,
             logging_level=logging.WARNING,
             runtime_env={"py_modules": [str(ENGINE_DIR)],
                          "excludes": ["__pycache__", "*.pyc"]})
    _say(f"connected; cluster resources: {ray.cluster_resources()}")


def task_resources(ray, options: dict[str, Any]) -> dict[str, Any] | str:
    """Ray resources of one run, or why no node of this cluster can ever run it."""
    gpus = int(options.get("gpus_per_run", 1))
    cpus = int(options.get("cpus_per_run", 1))
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    max_gpus = max((n.get("GPU", 0) for n in nodes), default=0)
    max_cpus = max((n.get("CPU", 0) for n in nodes), default=0)
    if max_gpus == 0:
        gpus = 0  # a CPU-only cluster: runs are scheduled by CPUs and train on the CPU
    if gpus > max_gpus:
        return (f"gpus_per_run={gpus}, but the largest node of the Ray cluster has "
                f"{max_gpus:g} GPUs; ask for at most {max_gpus:g}")
    if cpus > max_cpus:
        return (f"cpus_per_run={cpus}, but the largest node of the Ray cluster has "
                f"{max_cpus:g} CPUs; ask for at most {max_cpus:g}")
    return {"num_gpus": gpus, "num_cpus": cpus}


def start_writer(ray, store: Store):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    return ray.remote(StoreWriter).options(
        num_cpus=0, max_concurrency=1, max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
    ).remote(str(store.home))


def submit(ray, store: Store, sweep: SweepRecord, writer,
           resources: dict[str, Any]) -> dict[str, Any]:
    """run_id -> ObjectRef of its task, for every run still queued."""
    remote = ray.remote(execute_run)
    tasks = {}
    for run_id in sweep.run_ids:
        run = store.get_run(run_id)
        if run.status != QUEUED:  # stopped before the driver got here
            continue
        tasks[run_id] = remote.options(max_retries=0, name=f"precision-lab run {run_id}",
                                       **resources).remote(
            run_id, run.config.to_json(), writer, resources["num_gpus"] > 0)
    _say(f"submitted {len(tasks)} tasks, each with {resources}")
    return tasks


def supervise(ray, store: Store, sweep: SweepRecord, writer, tasks: dict[str, Any],
              signalled: _Signalled) -> None:
    """Until every task has ended: record endings, forward stop requests, cancel."""
    grace_s = float(sweep.options.get("stop_grace_s", DEFAULT_STOP_GRACE_S))
    asked: dict[str, float] = {}  # run_id -> monotonic time the stop was forwarded
    forced: set[str] = set()
    by_ref = {ref: run_id for run_id, ref in tasks.items()}
    while tasks:
        ready, _ = ray.wait(list(tasks.values()), num_returns=len(tasks), timeout=POLL_S,
                            fetch_local=False)
        for ref in ready:
            run_id = by_ref[ref]
            settle(ray, store, run_id, tasks.pop(run_id), run_id in asked, run_id in forced,
                   grace_s)
        wanted = set(tasks) if signalled.stop_all else set(store.stop_requests(sweep.id))
        for run_id in sorted((wanted & set(tasks)) - set(asked)):
            _say(f"run {run_id}: stop requested")
            writer.request_stop.remote(run_id)
            asked[run_id] = time.monotonic()
            if not _started(store, run_id):
                ray.cancel(tasks[run_id])  # still pending in Ray: nothing to wait for
        for run_id in (set(tasks) & set(asked)) - forced:
            if time.monotonic() - asked[run_id] >= grace_s:
                _say(f"run {run_id}: still running {grace_s:g} s after the stop request; "
                     "force-cancelling its Ray task")
                ray.cancel(tasks[run_id], force=True)
                forced.add(run_id)


def _started(store: Store, run_id: str) -> bool:
    """Whether Ray placed the run (the actor records the node when the task starts)."""
    return "@" in store.get_run(run_id).device_key


def settle(ray, store: Store, run_id: str, ref, stop_asked: bool, forced: bool,
           grace_s: float) -> None:
    """Record how a finished task ended when the task itself could not."""
    try:
        outcome = ray.get(ref)
        _say(f"run {run_id}: {outcome.get('status')}"
             + (f" ({outcome['reason']})" if outcome.get("reason") else ""))
    except Exception as exc:  # noqa: BLE001 - every Ray failure ends the run with a reason
        run = store.get_run(run_id)
        if not run.is_active:
            return
        status, reason = failure_outcome(exc, run.steps_completed, stop_asked, forced, grace_s)
        _say(f"run {run_id}: {status} ({reason})")
        finalize_run_data(store, run_id)  # the rows it sent before it ended are kept
        store.set_status(run_id, status, reason)
    run = store.get_run(run_id)
    if run.is_active and stop_asked:  # the task saw the stop before it started training
        store.set_status(run_id, STOPPED, f"stopped by request at step {run.steps_completed}")
    elif run.is_active:
        store.set_status(run_id, FAILED, "the Ray task ended without recording a final "
                                         f"status; see the sweep's {DRIVER_LOG}")


def failure_outcome(exc: BaseException, step: int, stop_asked: bool, forced: bool,
                    grace_s: float) -> tuple[str, str]:
    """(status, reason) of a run whose Ray task raised instead of returning."""
    from ray import exceptions as rx

    if stop_asked or isinstance(exc, rx.TaskCancelledError):
        how = f" (Ray task force-cancelled after {grace_s:g} s)" if forced else ""
        return STOPPED, f"stopped by request at step {step}{how}"
    if isinstance(exc, rx.OutOfMemoryError):
        return OOM, (f"out of memory at step {step}: Ray's memory monitor killed the task "
                     f"(the node ran low on RAM): {_first_line(exc)}")
    if isinstance(exc, rx.WorkerCrashedError):
        return FAILED, (f"the Ray worker process running this run died at step {step} "
                        f"(killed, or crashed): {_first_line(exc)}")
    if isinstance(exc, rx.RayTaskError):
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        return FAILED, f"{type(cause).__name__}: {_first_line(cause)}"[:2000]
    return FAILED, f"Ray: {type(exc).__name__} at step {step}: {_first_line(exc)}"[:2000]


def fail_sweep(store: Store, sweep: SweepRecord, reason: str) -> None:
    """The sweep could not run: every run not yet ended fails with the same reason."""
    _say(f"sweep {sweep.id}: failed: {reason}")
    store.fail_sweep(sweep.id, sweep.run_ids, reason)


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:500]


def _say(message: str) -> None:
    print(f"[ray driver {time.strftime('%H:%M:%S')}] {message}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
