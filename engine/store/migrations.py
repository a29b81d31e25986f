"""The database's tables and how an older database is brought up to them.

Every Store() runs `migrate` on open: tables are created with IF NOT EXISTS, so a
database written before a table existed gains it on its next open and nothing else is
touched; columns added later (telemetry.rank) are added by an idempotent step that is
safe when two processes open the same old database at once.
"""

from __future__ import annotations

import sqlite3
import time

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,              -- FIFO order of the device queue
    created_at REAL NOT NULL,          -- unix seconds
    started_at REAL,
    ended_at REAL,
    status TEXT NOT NULL,
    reason TEXT,
    config_json TEXT NOT NULL,
    device_key TEXT NOT NULL,          -- "cpu" | "cuda:N": one running run per key
    device_name TEXT,
    pid INTEGER,                       -- supervisor pid (process-group leader)
    pid_create_time REAL,              -- guards against pid reuse
    train_pid INTEGER,
    steps_completed INTEGER NOT NULL DEFAULT 0,
    total_steps INTEGER NOT NULL,
    summary_json TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS runs_status ON runs(status, device_key, seq);
CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    wall_time_s REAL, loss REAL, lr REAL, step_time_ms REAL, samples_per_s REAL,
    tokens_per_s REAL, mem_allocated_bytes INTEGER, mem_reserved_bytes INTEGER,
    mem_peak_bytes INTEGER, rss_bytes INTEGER, loss_scale REAL, skipped_steps INTEGER,
    grad_norm REAL, achieved_tflops REAL, mfu REAL,
    phase TEXT,                        -- warmup | steady | profile
    PRIMARY KEY (run_id, step)
) WITHOUT ROWID;
-- A finished run's metrics downsampled once (<= OVERVIEW_POINTS rows, spikes kept):
-- reading a long run for a chart then costs a few ms instead of a scan of every row.
CREATE TABLE IF NOT EXISTS metrics_overview (
    run_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    wall_time_s REAL, loss REAL, lr REAL, step_time_ms REAL, samples_per_s REAL,
    tokens_per_s REAL, mem_allocated_bytes INTEGER, mem_reserved_bytes INTEGER,
    mem_peak_bytes INTEGER, rss_bytes INTEGER, loss_scale REAL, skipped_steps INTEGER,
    grad_norm REAL, achieved_tflops REAL, mfu REAL, phase TEXT,
    PRIMARY KEY (run_id, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS telemetry (
    run_id TEXT NOT NULL,
    t_s REAL NOT NULL,                 -- unix seconds
    gpu_util_pct REAL, mem_util_pct REAL, gpu_mem_used_bytes INTEGER, power_w REAL,
    power_limit_w REAL, temp_c REAL, sm_clock_mhz REAL, throttle_reasons TEXT,
    cpu_pct REAL, rss_bytes INTEGER,
    rank INTEGER NOT NULL DEFAULT 0    -- process of a multi-process run (0: the only one)
);
CREATE INDEX IF NOT EXISTS telemetry_run ON telemetry(run_id, t_s);
CREATE TABLE IF NOT EXISTS kernels (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL, category TEXT, tensor_core TEXT, dtype TEXT, reason TEXT,
    total_us REAL, count INTEGER, cpu_op TEXT
);
CREATE INDEX IF NOT EXISTS kernels_run ON kernels(run_id);
"""

# == sweeps (engine/cluster/sweep.py, engine/cluster/ray_driver.py) =====================
# Separate tables, created with IF NOT EXISTS by every Store(): a database written before
# sweeps existed gains them on its next open, and the runs table is untouched (a run
# belongs to at most one sweep through sweep_runs).
_SWEEP_SCHEMA = """
CREATE TABLE IF NOT EXISTS sweeps (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,          -- unix seconds
    ended_at REAL,
    grid_json TEXT NOT NULL,           -- engine.cluster.sweep.SweepGrid as JSON
    backend TEXT NOT NULL,             -- local | ray
    ray_address TEXT,                  -- host:port of the Ray cluster (ray backend)
    options_json TEXT NOT NULL DEFAULT '{}',  -- Ray resources per run, stop grace
    status TEXT NOT NULL,              -- running | done | failed
    reason TEXT,
    driver_pid INTEGER,                -- ray backend: the driver process (session leader)
    driver_pid_create_time REAL
);
CREATE TABLE IF NOT EXISTS sweep_runs (
    run_id TEXT PRIMARY KEY,
    sweep_id TEXT NOT NULL,
    position INTEGER NOT NULL,         -- order of the run in the grid
    stop_requested_at REAL             -- ray backend: the driver stops/cancels the task
);
CREATE INDEX IF NOT EXISTS sweep_runs_sweep ON sweep_runs(sweep_id, position);
"""
# == end of sweeps ======================================================================


class NewerSchema(Exception):
    """The database was written by a newer Precision Lab (its user_version is higher)."""

    def __init__(self, version: int):
        super().__init__(version)
        self.version = version


def migrate(conn: sqlite3.Connection) -> None:
    """WAL mode, every table, every added column; raises NewerSchema for a newer file."""
    _switch_to_wal(conn)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise NewerSchema(version)
    conn.executescript(_SCHEMA)
    _add_telemetry_rank(conn)
    _add_run_annotations(conn)
    _add_series_columns(conn)
    conn.executescript(_SWEEP_SCHEMA)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


# == telemetry ranks =====================================================================
def _add_telemetry_rank(conn: sqlite3.Connection) -> None:
    """Databases written before multi-process runs: add telemetry.rank (0 for every old
    row). Idempotent, and safe when two processes open the same old database at once."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(telemetry)")}
    if "rank" in columns:
        return
    try:
        conn.execute("ALTER TABLE telemetry ADD COLUMN rank INTEGER NOT NULL DEFAULT 0")
    except sqlite3.OperationalError as exc:
        if "duplicate column" not in str(exc).lower():
            raise
# == end of telemetry ranks ==============================================================


# Columns added after the first schema: the trainer's create time, and what a user adds to
# a run after launch (archived flag, tags, a note). Older databases gain them on open.
RUN_ANNOTATION_COLUMNS = (
    # The trainer's start time: reconcile kills a trainer still alive for a failed run,
    # and only the process it recorded (pid reuse).
    ("train_pid_create_time", "REAL"),
    # The one trainer that may write the run's rows: claimed once, before its first step.
    ("trainer_token", "TEXT"),
    ("archived", "INTEGER NOT NULL DEFAULT 0"),
    ("tags_json", "TEXT NOT NULL DEFAULT '{}'"),
    ("note", "TEXT NOT NULL DEFAULT ''"),
)


def _add_run_annotations(conn: sqlite3.Connection) -> None:
    _add_columns(
        conn, [("runs", name, declaration) for name, declaration in RUN_ANNOTATION_COLUMNS]
    )


# Series columns added after the first schema: (table, column, declaration). Older
# databases gain them on open; their old rows read NULL (unknown).
SERIES_ADDED_COLUMNS = (
    # Steps measured while other work competed for the machine (engine.analysis.contention).
    ("metrics", "host_busy", "INTEGER"),
    ("metrics_overview", "host_busy", "INTEGER"),
    # The input pipeline per step (engine.training.loop): waiting for the next batch and
    # its host-to-device copy.
    ("metrics", "data_wait_ms", "REAL"),
    ("metrics_overview", "data_wait_ms", "REAL"),
    ("metrics", "h2d_copy_ms", "REAL"),
    ("metrics_overview", "h2d_copy_ms", "REAL"),
    # Host and GPU contention (engine.hardware.contention, engine.hardware.telemetry).
    ("telemetry", "load_per_core", "REAL"),
    ("telemetry", "others_cpu_cores", "REAL"),
    ("telemetry", "steal_pct", "REAL"),
    ("telemetry", "gpu_other_procs", "INTEGER"),
    ("telemetry", "sm_clock_max_mhz", "REAL"),
)


def _add_series_columns(conn: sqlite3.Connection) -> None:
    _add_columns(conn, SERIES_ADDED_COLUMNS)


def _add_columns(conn: sqlite3.Connection, columns) -> None:
    """ALTER TABLE ... ADD COLUMN for each (table, column, declaration) a table lacks.
    Idempotent, and safe when two processes open the same old database at once."""
    for table, name, declaration in columns:
        existing = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if name in existing:
            continue
        try:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")
        except sqlite3.OperationalError as exc:
            if "duplicate column" not in str(exc).lower():
                raise


# How long a first open keeps retrying the switch to WAL while other processes race for it.
WAL_SWITCH_DEADLINE_S = 30.0


def _switch_to_wal(conn: sqlite3.Connection) -> None:
    """Put the database in WAL mode, retrying while another process holds a lock.

    Switching needs an exclusive lock. When two processes open a new database at the same
    moment, both hold a shared lock and ask for the exclusive one; SQLite then answers
    "database is locked" at once to one of them instead of calling the busy handler
    (waiting would deadlock), so busy_timeout does not cover this step.
    """
    deadline = time.monotonic() + WAL_SWITCH_DEADLINE_S
    delay_s = 0.005
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
                return  # already switched (by us earlier or by another process): no lock needed
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            text = str(exc).lower()
            if ("locked" not in text and "busy" not in text) or time.monotonic() > deadline:
                raise
        time.sleep(delay_s)
        delay_s = min(delay_s * 2, 0.2)

