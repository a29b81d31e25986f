"""Opening the data directory and its SQLite database, connections and transactions,
and the runs table (records, statuses, summaries). See engine/store/__init__.py for why
SQLite in WAL mode and the layout of the data directory."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import secrets
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from engine.config import RunConfig
from engine.proc import PRIVATE_DIR_MODE, make_private
from engine.schema import (
    ACTIVE_STATUSES,
    FINAL_STATUSES,
    HOME_ENV,
    PEAKS_CACHE_FILENAME,
    QUEUED,
    RUNNING,
    RUNS_DIRNAME,
    STANDBY_LOG,
    STATUSES,
    RunSummary,
)
from engine.store.migrations import SCHEMA_VERSION, NewerSchema, migrate

DB_FILENAME = "precision_lab.sqlite3"
# Files of the data directory besides the database that hold a user's data.
PRIVATE_FILES = (STANDBY_LOG, PEAKS_CACHE_FILENAME)
DEFAULT_HOME = ".precision_lab"

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


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
    summary_json: str = field(default="{}", repr=False)
    config_error: str | None = None
    """Why the stored config does not parse (written by another version, edited by hand);
    `config` is then RunConfig() defaults for display only and the run is never trained
    (the worker ends it as failed with this reason)."""
    train_pid_create_time: float | None = None
    archived: bool = False  # hidden from the run lists unless asked for
    tags: dict[str, str] = field(default_factory=dict)
    note: str = ""

    @functools.cached_property
    def summary(self) -> dict[str, Any]:
        """The stored summary, parsed when first read: a list of 200 runs parses 9 KB of
        summary each (1.8 MB, ~35 ms on a 2-core machine), and a run picker reads none."""
        return json.loads(self.summary_json or "{}")

    @property
    def duration_s(self) -> float | None:
        """Seconds from start to end (to now while running); None before it started."""
        if self.started_at is None:
            return None
        return (self.ended_at or time.time()) - self.started_at

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
            "summary": self.summary, "archived": self.archived, "tags": self.tags,
            "note": self.note,
        }


class StoreCore:
    """Opening the data directory, connections, and the runs table. engine.store.Store
    adds the queue, the series and the sweeps to it."""

    def __init__(self, home: str | os.PathLike | None = None):
        self.home = Path(home).expanduser().resolve() if home else default_home()
        self.db_path = self.home / DB_FILENAME
        self._ensure_home()
        self._refuse_a_lost_database()
        self._migrate()

    # -- setup ------------------------------------------------------------------------------
    def _ensure_home(self) -> None:
        try:
            # 0o700: runs, logs and traces of one user are not everyone's business.
            self.home.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
            self.runs_dir.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
        except OSError as exc:
            raise StoreError(f"{HOME_ENV}={str(self.home)!r}: cannot create the data directory "
                             f"({exc.strerror}); point {HOME_ENV} at a writable folder") from exc
        # Made by an older version (755 / 644): fixed on open.
        make_private(self.home, PRIVATE_DIR_MODE)
        make_private(self.runs_dir, PRIVATE_DIR_MODE)
        for name in PRIVATE_FILES:
            make_private(self.home / name)

    def _refuse_a_lost_database(self) -> None:
        """A zero-byte database beside run folders means the run list was lost (a failed
        copy, a full disk at the wrong moment): say so, instead of silently starting an
        empty store that hides every earlier run."""
        try:
            empty = self.db_path.stat().st_size == 0
        except FileNotFoundError:
            return  # no database yet: a new one is created
        if not empty:
            return
        folders = (
            [p for p in self.runs_dir.iterdir() if p.is_dir()] if self.runs_dir.is_dir() else []
        )
        if folders:
            raise StoreError(
                f"{self.db_path}: the database file is empty (0 bytes) while runs/ holds "
                f"{len(folders)} run folder(s) of an earlier database: the run list is lost. "
                "Restore the file from a backup, or delete the empty file to start a new "
                "database (the run folders, with their logs and traces, stay in runs/)")

    def _migrate(self) -> None:
        try:
            with self.connect() as conn:
                migrate(conn)
            # SQLite gives its -wal and -shm files the database file's permissions.
            for suffix in ("", "-wal", "-shm"):
                make_private(Path(f"{self.db_path}{suffix}"))
        except NewerSchema as exc:
            raise StoreError(f"{self.db_path}: written by a newer Precision Lab (schema "
                             f"{exc.version} > {SCHEMA_VERSION}); upgrade this copy") from None
        except sqlite3.DatabaseError as exc:
            problem = (_storage_problem(exc) or self._read_only_problem()
                       or ("cannot open the database; if the file is corrupted, move it away "
                           "and restart (runs/ is kept)"))
            raise StoreError(f"{self.db_path}: {problem} ({exc})") from exc

    def _read_only_problem(self) -> str | None:
        """Why the data directory cannot be written, when it cannot: SQLite then fails with
        "unable to open database file", which must not read as a damaged database."""
        try:
            read_only_mount = bool(os.statvfs(self.home).f_flag & os.ST_RDONLY)
        except OSError:
            return None
        if read_only_mount:
            why = "its file system is mounted read-only"
        elif not os.access(self.home, os.W_OK):
            why = "this user may not write there"
        else:
            return None
        return (f"the data directory {str(self.home)!r} is read-only ({why}); the database "
                f"writes beside itself even to be read (SQLite's journal): make it writable or "
                f"point {HOME_ENV} at a writable folder. Nothing is damaged")

    @property
    def runs_dir(self) -> Path:
        return self.home / RUNS_DIRNAME

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
            problem = _storage_problem(exc) or self._read_only_problem()
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
        self.run_dir(run_id).mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
        return run_id

    def get_run(self, run_id: str) -> RunRecord:
        validate_run_id(run_id)
        with self.connect() as conn:
            conn.row_factory = sqlite3.Row
            row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        return _record(row)

    def list_runs(
        self, statuses: Iterable[str] | None = None, limit: int = 1000
    ) -> list[RunRecord]:
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

    _UPDATABLE = frozenset({"pid", "pid_create_time", "train_pid", "train_pid_create_time",
                            "device_name",
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

    def merge_summary(self, run_id: str, values: RunSummary) -> None:
        """Merge `values` into the run's summary. The engine writes only the keys declared
        in engine.schema.RunSummary (checked on the source by tests/test_house_rules.py)."""
        with self.transaction(immediate=True) as conn:
            row = conn.execute("SELECT summary_json FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(run_id)
            summary = json.loads(row[0] or "{}")
            summary.update(_json_safe(values))
            conn.execute("UPDATE runs SET summary_json = ? WHERE id = ?",
                         (json.dumps(summary), run_id))


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
    config_error = None
    try:
        config = _config_from_json(row["config_json"])
    except (ValueError, TypeError) as exc:
        # Show the run rather than hide it, and say why its config is not its own.
        config, config_error = RunConfig(), f"the stored config does not parse: {exc}"
    return RunRecord(
        id=row["id"],
        status=row["status"],
        reason=row["reason"],
        config=config,
        device_key=row["device_key"],
        device_name=row["device_name"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        pid=row["pid"],
        pid_create_time=row["pid_create_time"],
        train_pid=row["train_pid"],
        steps_completed=row["steps_completed"],
        total_steps=row["total_steps"],
        summary_json=row["summary_json"] or "{}",
        config_error=config_error,
        train_pid_create_time=row["train_pid_create_time"],
        archived=bool(row["archived"]),
        tags=stored_tags(row["tags_json"]),
        note=row["note"] or "",
    )


@functools.lru_cache(maxsize=4096)
def _config_from_json(text: str) -> RunConfig:
    """A stored config never changes and RunConfig is frozen: parse and validate each one
    once per process, not on every listing (200 runs: ~25 ms of a Runs or Compare render)."""
    return RunConfig.from_json(text)


def stored_tags(text: str | None) -> dict[str, str]:
    """A run's tags from their stored JSON ({} for anything else)."""
    try:
        tags = json.loads(text or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in tags.items()} if isinstance(tags, dict) else {}


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
