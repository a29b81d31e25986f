"""Sweeps (engine.cluster.sweep, engine.cluster.ray_driver): the sweep records, the runs
that belong to each, and the stop requests a Ray sweep's driver acts on."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

from engine.schema import (
    ACTIVE_STATUSES,
    FAILED,
    SWEEP_FAILED,
    SWEEP_LOCAL,
    SWEEP_RAY,
    SWEEP_RUNNING,
)
from engine.store.db import new_run_id, validate_run_id


class SweepNotFound(KeyError):
    def __init__(self, sweep_id: str):
        super().__init__(sweep_id)
        self.sweep_id = sweep_id

    def __str__(self) -> str:
        return (f"sweep_id={self.sweep_id!r}: no such sweep; `python -m engine sweep list` "
                "shows the sweeps")


@dataclass
class SweepRecord:
    id: str
    created_at: float
    ended_at: float | None
    grid: dict[str, Any]
    backend: str
    ray_address: str | None
    options: dict[str, Any]
    status: str
    reason: str | None
    driver_pid: int | None
    driver_pid_create_time: float | None
    run_ids: list[str] = field(default_factory=list)


def _sweep_record(row: sqlite3.Row, run_ids: list[str]) -> SweepRecord:
    return SweepRecord(
        id=row["id"], created_at=row["created_at"], ended_at=row["ended_at"],
        grid=json.loads(row["grid_json"]), backend=row["backend"],
        ray_address=row["ray_address"], options=json.loads(row["options_json"] or "{}"),
        status=row["status"], reason=row["reason"], driver_pid=row["driver_pid"],
        driver_pid_create_time=row["driver_pid_create_time"], run_ids=run_ids)
# == end of sweeps: records =============================================================



class SweepsMixin:
    """Store methods of sweeps (mixed into engine.store.Store)."""

    def create_sweep(self, grid: dict[str, Any], backend: str, ray_address: str | None = None,
                     options: dict[str, Any] | None = None) -> str:
        if backend not in (SWEEP_LOCAL, SWEEP_RAY):
            raise ValueError(f"backend={backend!r}: choose {SWEEP_LOCAL} or {SWEEP_RAY}")
        sweep_id = "sweep-" + new_run_id()
        with self.connect() as conn:
            conn.execute("INSERT INTO sweeps (id, created_at, grid_json, backend, ray_address,"
                         " options_json, status) VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (sweep_id, time.time(), json.dumps(grid), backend, ray_address,
                          json.dumps(options or {}), SWEEP_RUNNING))
        return sweep_id

    def link_sweep_run(self, sweep_id: str, run_id: str, position: int) -> None:
        with self.connect() as conn:
            conn.execute("INSERT INTO sweep_runs (run_id, sweep_id, position) VALUES (?, ?, ?)",
                         (run_id, sweep_id, position))

    def get_sweep(self, sweep_id: str) -> SweepRecord:
        validate_run_id(sweep_id)
        with self.connect() as conn:
            conn.row_factory = sqlite3.Row
            row = conn.execute("SELECT * FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
            if row is None:
                raise SweepNotFound(sweep_id)
            run_ids = [r[0] for r in conn.execute(
                "SELECT run_id FROM sweep_runs WHERE sweep_id = ? ORDER BY position",
                (sweep_id,))]
        return _sweep_record(row, run_ids)

    def list_sweeps(self, limit: int = 200) -> list[SweepRecord]:
        with self.connect() as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute("SELECT * FROM sweeps ORDER BY created_at DESC LIMIT ?",
                                (limit,)).fetchall()
            links = conn.execute("SELECT sweep_id, run_id FROM sweep_runs ORDER BY position"
                                 ).fetchall()
        by_sweep: dict[str, list[str]] = {}
        for sweep_id, run_id in links:
            by_sweep.setdefault(sweep_id, []).append(run_id)
        return [_sweep_record(row, by_sweep.get(row["id"], [])) for row in rows]

    def set_sweep_status(self, sweep_id: str, status: str, reason: str | None = None) -> None:
        ended = time.time() if status != SWEEP_RUNNING else None
        with self.connect() as conn:
            conn.execute("UPDATE sweeps SET status = ?, reason = COALESCE(?, reason),"
                         " ended_at = COALESCE(?, ended_at) WHERE id = ?",
                         (status, reason, ended, sweep_id))

    def fail_sweep(self, sweep_id: str, run_ids: list[str], reason: str) -> None:
        """The sweep and every run of it not yet ended fail with `reason`, in one
        transaction: a reader between two separate writes would see every run ended and
        the sweep still running, and call it done."""
        now = time.time()
        with self.transaction(immediate=True) as conn:
            for run_id in run_ids:
                conn.execute(
                    f"UPDATE runs SET status = ?, reason = ?, ended_at = ?"
                    f" WHERE id = ? AND status IN ({','.join('?' * len(ACTIVE_STATUSES))})",
                    (FAILED, reason, now, run_id, *ACTIVE_STATUSES),
                )
            conn.execute("UPDATE sweeps SET status = ?, reason = COALESCE(reason, ?),"
                         " ended_at = COALESCE(ended_at, ?) WHERE id = ?",
                         (SWEEP_FAILED, reason, now, sweep_id))

    def set_sweep_driver(self, sweep_id: str, pid: int, pid_create_time: float | None) -> None:
        with self.connect() as conn:
            conn.execute("UPDATE sweeps SET driver_pid = ?, driver_pid_create_time = ?"
                         " WHERE id = ?", (pid, pid_create_time, sweep_id))

    def sweep_of_run(self, run_id: str) -> SweepRecord | None:
        with self.connect() as conn:
            row = conn.execute("SELECT sweep_id FROM sweep_runs WHERE run_id = ?",
                               (run_id,)).fetchone()
        return self.get_sweep(row[0]) if row else None

    def request_run_stop(self, run_id: str) -> None:
        """Ask a Ray run's driver to stop it (the first request's time is kept)."""
        with self.connect() as conn:
            conn.execute("UPDATE sweep_runs SET stop_requested_at ="
                         " COALESCE(stop_requested_at, ?) WHERE run_id = ?", (time.time(), run_id))

    def stop_requests(self, sweep_id: str) -> dict[str, float]:
        """run_id -> unix time of its stop request, for the sweep's runs that have one."""
        with self.connect() as conn:
            rows = conn.execute("SELECT run_id, stop_requested_at FROM sweep_runs WHERE"
                                " sweep_id = ? AND stop_requested_at IS NOT NULL", (sweep_id,))
            return {run_id: requested_at for run_id, requested_at in rows}

    def set_run_placement(self, run_id: str, device_key: str, device_name: str | None) -> None:
        """Where Ray placed a run (e.g. "cuda:0@10.0.0.5"); such a key never matches a local
        device, so Ray runs neither wait in nor block the local device queues."""
        with self.connect() as conn:
            conn.execute("UPDATE runs SET device_key = ?, device_name = ? WHERE id = ?",
                         (device_key, device_name, run_id))
    # == end of sweeps ==================================================================

