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
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from .config import RunConfig

if TYPE_CHECKING:  # pandas is imported where frames are built: the supervisor never needs it
    import pandas as pd

SCHEMA_VERSION = 1
DB_FILENAME = "precision_lab.sqlite3"
HOME_ENV = "PRECISION_LAB_HOME"
DEFAULT_HOME = ".precision_lab"

QUEUED, RUNNING, FINISHED, FAILED, STOPPED, DIVERGED, OOM = (
    "queued", "running", "finished", "failed", "stopped", "diverged", "oom")
STATUSES = (QUEUED, RUNNING, FINISHED, FAILED, STOPPED, DIVERGED, OOM)
ACTIVE_STATUSES = (QUEUED, RUNNING)
FINAL_STATUSES = (FINISHED, FAILED, STOPPED, DIVERGED, OOM)

OVERVIEW_POINTS = 2000
# The series whose spikes the overview keeps (per bucket min and max of each).
OVERVIEW_SERIES = ("loss", "samples_per_s")
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")

# Per logged step. Units are in the names; NULL where a value does not apply
# (loss_scale outside fp16-amp, CUDA memory on a CPU run).
METRIC_COLUMNS = (
    "step", "wall_time_s", "loss", "lr", "step_time_ms", "samples_per_s", "tokens_per_s",
    "mem_allocated_bytes", "mem_reserved_bytes", "mem_peak_bytes", "rss_bytes",
    "loss_scale", "skipped_steps", "grad_norm", "achieved_tflops", "mfu", "phase",
)
TELEMETRY_COLUMNS = (
    "t_s", "gpu_util_pct", "mem_util_pct", "gpu_mem_used_bytes", "power_w", "power_limit_w",
    "temp_c", "sm_clock_mhz", "throttle_reasons", "cpu_pct", "rss_bytes",
)
KERNEL_COLUMNS = (
    "name", "category", "tensor_core", "dtype", "reason", "total_us", "count", "cpu_op",
)

_SCHEMA = f"""
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
    summary_json TEXT NOT NULL DEFAULT '{{}}'
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

# == sweeps (engine/sweep.py, engine/ray_driver.py) =====================================
# Separate tables, created with IF NOT EXISTS by every Store(): a database written before
# sweeps existed gains them on its next open, and the runs table is untouched (a run
# belongs to at most one sweep through sweep_runs).
SWEEP_LOCAL, SWEEP_RAY = "local", "ray"
SWEEP_RUNNING, SWEEP_DONE, SWEEP_FAILED = "running", "done", "failed"
_SWEEP_SCHEMA = """
CREATE TABLE IF NOT EXISTS sweeps (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,          -- unix seconds
    ended_at REAL,
    grid_json TEXT NOT NULL,           -- engine.sweep.SweepGrid as JSON
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


class StoreError(RuntimeError):
    """The data directory or database cannot be used; the message says what to do."""


class RunNotFound(KeyError):
    def __init__(self, run_id: str):
        super().__init__(run_id)
        self.run_id = run_id

    def __str__(self) -> str:
        return f"run_id={self.run_id!r}: no such run; `python -m engine list` shows the runs"


def validate_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not RUN_ID_RE.fullmatch(run_id):
        raise ValueError(f"run_id={run_id!r}: not a valid run id (letters, digits, - and _, "
                         "up to 64 characters); `python -m engine list` shows the runs")
    return run_id


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def default_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).expanduser().resolve()


@dataclass
class RunRecord:
    id: str
    status: str
    reason: str | None
    config: RunConfig
    device_key: str
    device_name: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    pid: int | None
    pid_create_time: float | None
    train_pid: int | None
    steps_completed: int
    total_steps: int
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.id, "status": self.status, "reason": self.reason,
            "config": self.config.to_dict(), "device": self.device_key,
            "device_name": self.device_name, "created_at": self.created_at,
            "started_at": self.started_at, "ended_at": self.ended_at, "pid": self.pid,
            "steps_completed": self.steps_completed, "total_steps": self.total_steps,
            "summary": self.summary,
        }


class Store:
    def __init__(self, home: str | os.PathLike | None = None):
        self.home = Path(home).expanduser().resolve() if home else default_home()
        self.db_path = self.home / DB_FILENAME
        self._ensure_home()
        self._migrate()

    # -- setup ------------------------------------------------------------------------------
    def _ensure_home(self) -> None:
        try:
            # 0o700: runs, logs and traces of one user are not everyone's business.
            self.runs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise StoreError(f"{HOME_ENV}={str(self.home)!r}: cannot create the data directory "
                             f"({exc.strerror}); point {HOME_ENV} at a writable folder") from exc

    def _migrate(self) -> None:
        try:
            with self.connect() as conn:
                _switch_to_wal(conn)
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise StoreError(f"{self.db_path}: written by a newer Precision Lab "
                                     f"(schema {version} > {SCHEMA_VERSION}); upgrade this copy")
                conn.executescript(_SCHEMA)
                _add_telemetry_rank(conn)  # telemetry ranks section
                conn.executescript(_SWEEP_SCHEMA)  # sweeps section
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.DatabaseError as exc:
            problem = _storage_problem(exc) or ("cannot open the database; if the file is "
                                                "corrupted, move it away and restart (runs/ is kept)")
            raise StoreError(f"{self.db_path}: {problem} ({exc})") from exc

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / validate_run_id(run_id)

    def open_connection(self) -> sqlite3.Connection:
        """A configured connection the caller closes: for a writer's hot path (the metric
        buffer), where reopening per flush costs a WAL checkpoint and an fsync each time."""
        # isolation_level=None: we issue BEGIN ourselves where a transaction is needed.
        conn = sqlite3.connect(self.db_path, timeout=30.0, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable at checkpoints
        return conn

    @contextlib.contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        try:
            conn = self.open_connection()
        except sqlite3.DatabaseError as exc:
            problem = _storage_problem(exc)
            if problem:
                raise StoreError(f"{self.db_path}: {problem} ({exc})") from exc
            raise
        try:
            yield conn
        except Exception as exc:
            problem = _storage_problem(exc)
            if problem:
                raise StoreError(f"{self.db_path}: {problem} ({exc})") from exc
            raise
        finally:
            conn.close()

    @contextlib.contextmanager
    def transaction(self, immediate: bool = False) -> Iterator[sqlite3.Connection]:
        with self.connect() as conn:
            conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    # -- runs -------------------------------------------------------------------------------
    def create_run(self, config: RunConfig, device_key: str, device_name: str | None = None,
                   run_id: str | None = None) -> str:
        run_id = validate_run_id(run_id or new_run_id())
        with self.transaction(immediate=True) as conn:
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM runs").fetchone()[0]
            conn.execute(
                "INSERT INTO runs (id, seq, created_at, status, config_json, device_key,"
                " device_name, total_steps) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, seq, time.time(), QUEUED, config.to_json(), device_key, device_name,
                 config.steps))
        self.run_dir(run_id).mkdir(parents=True, exist_ok=True, mode=0o700)
        return run_id

    def get_run(self, run_id: str) -> RunRecord:
        validate_run_id(run_id)
        with self.connect() as conn:
            conn.row_factory = sqlite3.Row
            row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        return _record(row)

    def list_runs(self, statuses: Iterable[str] | None = None, limit: int = 1000) -> list[RunRecord]:
        sql, params = "SELECT * FROM runs", []
        if statuses:
            statuses = list(statuses)
            sql += f" WHERE status IN ({','.join('?' * len(statuses))})"
            params += statuses
        sql += " ORDER BY seq DESC LIMIT ?"
        with self.connect() as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute(sql, (*params, limit)).fetchall()
        return [_record(row) for row in rows]

    _UPDATABLE = frozenset({"pid", "pid_create_time", "train_pid", "device_name",
                            "started_at", "ended_at", "steps_completed"})

    def update_run(self, run_id: str, **fields: Any) -> None:
        unknown = set(fields) - self._UPDATABLE
        if unknown:
            raise ValueError(f"not updatable: {sorted(unknown)}")
        assignments = ", ".join(f"{name} = ?" for name in fields)
        with self.connect() as conn:
            conn.execute(f"UPDATE runs SET {assignments} WHERE id = ?", (*fields.values(), run_id))

    def set_status(self, run_id: str, status: str, reason: str | None = None,
                   only_from: Iterable[str] = ACTIVE_STATUSES) -> bool:
        """Move a run to `status` if it is currently in `only_from`; True when it moved.

        The condition makes transitions race-free: a run that the user stopped is not
        turned back into "finished" by a worker that was about to write its result.
        """
        if status not in STATUSES:
            raise ValueError(f"status={status!r}: choose one of {', '.join(STATUSES)}")
        only_from = list(only_from)
        now = time.time()
        ended = now if status in FINAL_STATUSES else None
        started = now if status == RUNNING else None
        with self.connect() as conn:
            cursor = conn.execute(
                f"UPDATE runs SET status = ?, reason = COALESCE(?, reason),"
                f" ended_at = COALESCE(?, ended_at), started_at = COALESCE(?, started_at)"
                f" WHERE id = ? AND status IN ({','.join('?' * len(only_from))})",
                (status, reason, ended, started, run_id, *only_from))
            return cursor.rowcount == 1

    def merge_summary(self, run_id: str, values: dict[str, Any]) -> None:
        with self.transaction(immediate=True) as conn:
            row = conn.execute("SELECT summary_json FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(run_id)
            summary = json.loads(row[0] or "{}")
            summary.update(_json_safe(values))
            conn.execute("UPDATE runs SET summary_json = ? WHERE id = ?",
                         (json.dumps(summary), run_id))

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

    # -- metrics ----------------------------------------------------------------------------
    def write_metrics(self, run_id: str, rows: list[dict[str, Any]],
                      conn: sqlite3.Connection | None = None) -> None:
        """Insert metric rows and advance steps_completed, in one transaction."""
        if not rows:
            return
        values = [(run_id, *(_sql_value(row.get(c)) for c in METRIC_COLUMNS)) for row in rows]
        placeholders = ",".join("?" * (len(METRIC_COLUMNS) + 1))
        last_step = max(int(row["step"]) for row in rows)
        with contextlib.ExitStack() as stack:
            if conn is None:
                conn = stack.enter_context(self.connect())
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(f"INSERT OR REPLACE INTO metrics (run_id, {','.join(METRIC_COLUMNS)})"
                                 f" VALUES ({placeholders})", values)
                conn.execute("UPDATE runs SET steps_completed = MAX(steps_completed, ?)"
                             " WHERE id = ?", (last_step, run_id))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def read_metrics(self, run_id: str, after_step: int = 0, max_points: int | None = 2000,
                     columns: Iterable[str] | None = None) -> pd.DataFrame:
        """Metric rows with step > after_step, downsampled to ~max_points (min/max kept).

        `columns` limits both the query and the downsampling to the series a chart needs.
        """
        import pandas as pd

        from .downsample import downsample_minmax

        wanted = list(columns) if columns else list(METRIC_COLUMNS)
        bad = [c for c in wanted if c not in METRIC_COLUMNS]
        if bad:
            raise ValueError(f"columns={bad}: unknown metric; known: {', '.join(METRIC_COLUMNS)}")
        selected = ["step"] + [c for c in wanted if c != "step"]
        with self.connect() as conn:
            table = "metrics"
            if after_step == 0 and max_points and max_points <= OVERVIEW_POINTS:
                has_overview = conn.execute("SELECT 1 FROM metrics_overview WHERE run_id = ?"
                                            " LIMIT 1", (run_id,)).fetchone()
                table = "metrics_overview" if has_overview else "metrics"
            frame = pd.read_sql_query(
                f"SELECT {','.join(selected)} FROM {table} WHERE run_id = ? AND step > ?"
                " ORDER BY step", conn, params=(run_id, after_step))
        if max_points:
            numeric = [c for c in selected if c not in ("step", "phase", "wall_time_s")]
            frame = downsample_minmax(frame, numeric, max_points).reset_index(drop=True)
        return frame

    def write_overview(self, run_id: str) -> int:
        """Downsample a finished run's metrics once into metrics_overview; rows written.

        Called by the worker when the run ends. Reads with after_step=0 and
        max_points <= OVERVIEW_POINTS use it; incremental reads never do.
        """
        from .downsample import downsample_minmax

        frame = self.read_metrics(run_id, max_points=None)
        if frame.empty:
            return 0
        keep = downsample_minmax(frame, list(OVERVIEW_SERIES), OVERVIEW_POINTS)
        rows = keep.astype(object).where(keep.notna(), None).to_dict("records")
        placeholders = ",".join("?" * (len(METRIC_COLUMNS) + 1))
        with self.transaction(immediate=True) as conn:
            conn.execute("DELETE FROM metrics_overview WHERE run_id = ?", (run_id,))
            conn.executemany(
                f"INSERT INTO metrics_overview (run_id, {','.join(METRIC_COLUMNS)})"
                f" VALUES ({placeholders})",
                [(run_id, *(_sql_value(row.get(c)) for c in METRIC_COLUMNS)) for row in rows])
        return len(rows)

    def metrics_count(self, run_id: str) -> int:
        with self.connect() as conn:
            return conn.execute("SELECT COUNT(*) FROM metrics WHERE run_id = ?",
                                (run_id,)).fetchone()[0]

    def last_metric(self, run_id: str) -> dict[str, Any] | None:
        with self.connect() as conn:
            conn.row_factory = sqlite3.Row
            row = conn.execute("SELECT * FROM metrics WHERE run_id = ? ORDER BY step DESC"
                               " LIMIT 1", (run_id,)).fetchone()
        return dict(row) if row else None

    # -- telemetry and kernels ------------------------------------------------------------
    def write_telemetry(self, run_id: str, rows: list[dict[str, Any]], rank: int = 0) -> None:
        """Telemetry rows of one process; `rank`: which one in a multi-process run."""
        if not rows:
            return
        placeholders = ",".join("?" * (len(TELEMETRY_COLUMNS) + 2))
        with self.transaction(immediate=True) as conn:
            conn.executemany(
                f"INSERT INTO telemetry (run_id, rank, {','.join(TELEMETRY_COLUMNS)})"
                f" VALUES ({placeholders})",
                [(run_id, int(rank), *(_sql_value(row.get(c)) for c in TELEMETRY_COLUMNS))
                 for row in rows])

    def read_telemetry(self, run_id: str, after_t_s: float = 0.0,
                       max_points: int | None = 2000) -> pd.DataFrame:
        """TELEMETRY_COLUMNS plus `rank`, by time; downsampled per rank (each rank's
        spikes kept, about max_points rows in all)."""
        import pandas as pd

        from .downsample import downsample_minmax

        with self.connect() as conn:
            frame = pd.read_sql_query(
                f"SELECT {','.join(TELEMETRY_COLUMNS)}, rank FROM telemetry"
                " WHERE run_id = ? AND t_s > ? ORDER BY t_s", conn, params=(run_id, after_t_s))
        if max_points and len(frame) > max_points:
            numeric = [c for c in TELEMETRY_COLUMNS if c not in ("t_s", "throttle_reasons")]
            if frame["rank"].nunique() == 1:
                return downsample_minmax(frame, numeric, max_points).reset_index(drop=True)
            ranks = frame.groupby("rank", sort=True)
            share = max(4, max_points // ranks.ngroups)
            frame = pd.concat([downsample_minmax(part, numeric, share) for _, part in ranks])
            frame = frame.sort_values("t_s", kind="stable").reset_index(drop=True)
        return frame

    def write_kernels(self, run_id: str, rows: list[dict[str, Any]]) -> None:
        placeholders = ",".join("?" * (len(KERNEL_COLUMNS) + 1))
        with self.transaction(immediate=True) as conn:
            conn.execute("DELETE FROM kernels WHERE run_id = ?", (run_id,))
            conn.executemany(
                f"INSERT INTO kernels (run_id, {','.join(KERNEL_COLUMNS)}) VALUES ({placeholders})",
                [(run_id, *(_sql_value(row.get(c)) for c in KERNEL_COLUMNS)) for row in rows])

    def read_kernels(self, run_id: str) -> pd.DataFrame:
        import pandas as pd

        with self.connect() as conn:
            return pd.read_sql_query(
                f"SELECT {','.join(KERNEL_COLUMNS)} FROM kernels WHERE run_id = ?"
                " ORDER BY total_us DESC", conn, params=(run_id,))

    # == sweeps (engine/sweep.py, engine/ray_driver.py) =================================
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


# == sweeps: records ====================================================================
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


_STORAGE_PROBLEMS = (
    (("malformed", "not a database"),
     "cannot open the database; the file is damaged: move it away and restart (runs/ is kept)"),
    (("disk is full", "database or disk is full"),
     f"the data directory's disk is full: free space there or point {HOME_ENV} elsewhere; "
     "existing runs are kept"),
    (("readonly database", "read-only"),
     f"the database is read-only: make the data directory writable or point {HOME_ENV} "
     "elsewhere"),
    (("disk i/o error",),
     "cannot read or write the database: the disk under the data directory is full or "
     f"failing (a full disk shows up this way in WAL mode); free space there or point "
     f"{HOME_ENV} elsewhere; existing runs are kept"),
)


# == multi-GPU claims ====================================================================
# A run's device_key is its first GPU; an N-process CUDA run (config nprocs = N) holds
# cuda:K..cuda:K+N-1. A run starts when none of its GPUs is held by a running run and no
# earlier queued run wants any of them (FIFO across overlapping runs: a 4-GPU run is not
# starved by a stream of 1-GPU runs). CPU runs, whatever nprocs, share the one "cpu" key.
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
# == end of multi-GPU claims =============================================================


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


def _storage_problem(exc: BaseException) -> str | None:
    """What a sqlite3 error (or pandas wrapping one) says about the storage, if anything.

    A busy/locked database is not a storage problem and is not translated.
    """
    if not (isinstance(exc, sqlite3.DatabaseError) or type(exc).__name__ == "DatabaseError"):
        return None
    text = str(exc).lower()
    for needles, message in _STORAGE_PROBLEMS:
        if any(needle in text for needle in needles):
            return message
    return None


def _record(row: sqlite3.Row) -> RunRecord:
    try:
        config = RunConfig.from_json(row["config_json"])
    except ValueError:
        # A config written by another version: show the run rather than hide it.
        config = RunConfig()
    return RunRecord(
        id=row["id"], status=row["status"], reason=row["reason"], config=config,
        device_key=row["device_key"], device_name=row["device_name"],
        created_at=row["created_at"], started_at=row["started_at"], ended_at=row["ended_at"],
        pid=row["pid"], pid_create_time=row["pid_create_time"], train_pid=row["train_pid"],
        steps_completed=row["steps_completed"], total_steps=row["total_steps"],
        summary=json.loads(row["summary_json"] or "{}"))


def _sql_value(value: Any) -> Any:
    """SQLite has no inf/NaN literals worth keeping apart: store non-finite floats as-is
    (SQLite keeps inf; NaN becomes NULL), numpy scalars as Python numbers."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    if hasattr(value, "item"):
        return value.item()
    return value


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item"):
        return _json_safe(value.item())
    return value
