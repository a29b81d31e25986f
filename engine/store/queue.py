"""The device queue: one running run per device key, FIFO, multi-GPU claims.

A run's device_key is its first GPU; an N-process CUDA run (config nprocs = N) holds
cuda:K..cuda:K+N-1. A run starts when none of its GPUs is held by a running run and no
earlier queued run wants any of them (FIFO across overlapping runs: a 4-GPU run is not
starved by a stream of 1-GPU runs). CPU runs, whatever nprocs, share the one "cpu" key.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time

from engine.schema import QUEUED, RUNNING


class ClaimLost(RuntimeError):
    """Another trainer holds this run: this one must not write its rows or its status."""

    def __init__(self, run_id: str):
        super().__init__(f"run {run_id} is claimed by another trainer; this one stops "
                         "without writing")
        self.run_id = run_id


class QueueMixin:
    """Store methods of the device queue (mixed into engine.store.Store)."""

    def claim_trainer(self, run_id: str, token: str) -> bool:
        """Make `token` the run's one trainer; False when the run is not running or another
        trainer claimed it first (e.g. a stalled standby resuming after the supervisor
        had already started a fresh trainer)."""
        with self.connect() as conn:
            cursor = conn.execute("UPDATE runs SET trainer_token = ? WHERE id = ? AND status = ?"
                                  " AND trainer_token IS NULL", (token, run_id, RUNNING))
            return cursor.rowcount == 1

    def holds_claim(self, run_id: str, token: str) -> bool:
        with self.connect() as conn:
            row = conn.execute("SELECT trainer_token FROM runs WHERE id = ?", (run_id,)).fetchone()
        return row is not None and row[0] == token

    def claim_device(self, run_id: str) -> bool:
        """Start `run_id` if it is the oldest queued run of its device and the device is free.

        One BEGIN IMMEDIATE transaction: two workers polling at once cannot both win.
        """
        with self.transaction(immediate=True) as conn:
            row = conn.execute("SELECT device_key, status FROM runs WHERE id = ?",
                               (run_id,)).fetchone()
            if row is None or row[1] != QUEUED:
                return False
            device_key = row[0]
            if _GPU_KEY_RE.fullmatch(device_key):
                if not _gpus_free_and_first(conn, run_id):
                    return False
            else:
                busy = conn.execute("SELECT 1 FROM runs WHERE device_key = ? AND status = ?",
                                    (device_key, RUNNING)).fetchone()
                first = conn.execute("SELECT id FROM runs WHERE device_key = ? AND status = ?"
                                     " ORDER BY seq LIMIT 1", (device_key, QUEUED)).fetchone()
                if busy or first is None or first[0] != run_id:
                    return False
            conn.execute("UPDATE runs SET status = ?, started_at = ? WHERE id = ?",
                         (RUNNING, time.time(), run_id))
            return True

    def queue_position(self, run_id: str) -> int | None:
        """1-based place in the device's queue (1 = next to start), None if not queued."""
        with self.connect() as conn:
            row = conn.execute("SELECT device_key, seq, status FROM runs WHERE id = ?",
                               (run_id,)).fetchone()
            if row is None or row[2] != QUEUED:
                return None
            ahead = conn.execute("SELECT COUNT(*) FROM runs WHERE device_key = ? AND"
                                 " status = ? AND seq < ?",
                                 (row[0], QUEUED, row[1])).fetchone()[0]
        return ahead + 1

_GPU_KEY_RE = re.compile(r"cuda:(\d+)")


def _gpus_of(device_key: str, config_json: str) -> set[str]:
    match = _GPU_KEY_RE.fullmatch(device_key)
    if match is None:
        return {device_key}
    try:
        nprocs = int(json.loads(config_json).get("nprocs", 1))
    except (ValueError, TypeError, AttributeError):
        nprocs = 1
    first = int(match.group(1))
    return {f"cuda:{index}" for index in range(first, first + max(1, nprocs))}


def _gpus_free_and_first(conn: sqlite3.Connection, run_id: str) -> bool:
    rows = conn.execute("SELECT id, seq, status, device_key, config_json FROM runs"
                        " WHERE status IN (?, ?) AND device_key LIKE 'cuda:%'",
                        (QUEUED, RUNNING)).fetchall()
    mine = next(r for r in rows if r[0] == run_id)
    wanted = _gpus_of(mine[3], mine[4])
    for other_id, seq, status, device_key, config_json in rows:
        if other_id == run_id or not wanted & _gpus_of(device_key, config_json):
            continue
        if status == RUNNING or seq < mine[1]:
            return False
    return True
