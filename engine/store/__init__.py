"""The embedded store: SQLite in WAL mode under the data directory.

Why SQLite/WAL: stdlib, real transactions, several writer processes (one worker per
run) plus readers (the UI, the CLI), and it survives a killed writer. Connections are
short-lived and opened per call: Streamlit runs scripts on several threads, and a
worker's connection must not outlive a fork. The metric writer keeps one connection
for its own hot path.

Layout of the data directory (env `PRECISION_LAB_HOME`, default ./.precision_lab):
    precision_lab.sqlite3      the database
    runs/<run_id>/worker.log   stdout/stderr of the worker
    runs/<run_id>/trace.json.gz profiler trace (when profiled)
    runs/<run_id>/trace-rank<N>.json.gz  rank N's trace of a multi-process run

One class, `Store`, in parts: db (opening, connections, the runs table), migrations
(tables and added columns), queue (device claims), series (metrics, telemetry,
kernels), sweeps, manage (archive, tags, notes, delete); downsample is the min/max
bucketing the series reads use.
"""

from engine.schema import HOME_ENV
from engine.store.db import (
    DB_FILENAME,
    DEFAULT_HOME,
    RunNotFound,
    RunRecord,
    StoreCore,
    StoreError,
    default_home,
    new_run_id,
    validate_run_id,
)
from engine.store.manage import ManageMixin, RunActive
from engine.store.queue import ClaimLost, QueueMixin
from engine.store.series import SeriesMixin
from engine.store.sweeps import SweepNotFound, SweepRecord, SweepsMixin


class Store(ManageMixin, QueueMixin, SeriesMixin, SweepsMixin, StoreCore):
    """The data directory and its database; see the module docstring."""


__all__ = [
    "ClaimLost",
    "DB_FILENAME",
    "DEFAULT_HOME",
    "HOME_ENV",
    "RunActive",
    "RunNotFound",
    "RunRecord",
    "Store",
    "StoreError",
    "SweepNotFound",
    "SweepRecord",
    "default_home",
    "new_run_id",
    "validate_run_id",
]
