"""Ray sweep runs as the launcher and the sweep module see them (no ray import): which
runs are Ray's, why one failed when its driver died, and how a stop is requested.

A Ray run's pid is its sweep driver's (engine.cluster.ray_driver), which must never be
signalled for one run: the stop is written to the store (sweep_runs.stop_requested_at);
the driver polls it, stops the task cooperatively and force-cancels it after the grace.
"""

from __future__ import annotations

import time

from engine.proc import is_alive
from engine.schema import DRIVER_LOG, QUEUED, STOPPED, SWEEP_RAY
from engine.store import RunRecord, Store, SweepRecord

# A stop is cooperative first; the driver force-cancels the task (ray.cancel(force=True))
# after this grace.
DEFAULT_STOP_GRACE_S = 5.0

STOP_SETTLE_S = 5.0  # after the grace period: the cancel and its record take a moment




def is_ray_run(store: Store, run_id: str) -> bool:
    sweep = store.sweep_of_run(run_id)
    return sweep is not None and sweep.backend == SWEEP_RAY


def driver_gone_reason(store: Store, run: RunRecord) -> str | None:
    """reconcile's reason for an active Ray run whose pid (its driver) is dead; None for
    other runs."""
    sweep = store.sweep_of_run(run.id)
    if sweep is None or sweep.backend != SWEEP_RAY:
        return None
    return (f"the Ray sweep driver (pid {run.pid}) of sweep {sweep.id} is gone without a "
            f"final status for this run (at step {run.steps_completed}); Ray ends a driver's "
            f"tasks with it; see sweeps/{sweep.id}/{DRIVER_LOG} in the data directory")


def stop_ray_run(run_id: str, store: Store) -> RunRecord:
    """launcher.stop for a Ray run: request the stop, wait for the driver to end it."""
    pending = request_ray_stops(store, [run_id])
    sweep = store.sweep_of_run(run_id)
    if pending and sweep is not None:
        wait_ray_runs_ended(store, sweep, pending)
    return store.get_run(run_id)


def request_ray_stops(store: Store, run_ids: list[str]) -> list[str]:
    """Record stop requests; the ids of the runs the driver still has to end."""
    pending = []
    for run_id in run_ids:
        if not store.get_run(run_id).is_active:
            continue
        store.request_run_stop(run_id)
        # Not started by Ray yet: stopped now (the actor refuses to start a run that is
        # no longer queued, and the driver cancels the pending task).
        if not store.set_status(run_id, STOPPED, "stopped while queued", only_from=(QUEUED,)):
            pending.append(run_id)
    return pending


def wait_ray_runs_ended(store: Store, sweep: SweepRecord, run_ids: list[str]) -> None:
    """Until the runs end, at most the sweep's stop grace plus a few seconds. A run whose
    driver is not running is marked stopped here: nobody else would."""
    grace_s = float(sweep.options.get("stop_grace_s", DEFAULT_STOP_GRACE_S))
    deadline = time.monotonic() + grace_s + STOP_SETTLE_S
    while True:
        active = [run for run in map(store.get_run, run_ids) if run.is_active]
        if not active:
            return
        if not is_alive(sweep.driver_pid, sweep.driver_pid_create_time):
            for run in active:
                store.set_status(run.id, STOPPED, f"stopped by request at step "
                                 f"{run.steps_completed} (its Ray sweep driver was not running)")
            return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.2)
