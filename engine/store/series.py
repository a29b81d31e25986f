"""Per-step series of a run: metrics (and their downsampled overview), telemetry, and
the profiler window's kernel table."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import TYPE_CHECKING, Any, Iterable

from engine.schema import KERNEL_COLUMNS, METRIC_COLUMNS, TELEMETRY_COLUMNS
from engine.store.db import _sql_value
from engine.store.queue import ClaimLost

if TYPE_CHECKING:  # pandas is imported where frames are built: the supervisor never needs it
    import pandas as pd

OVERVIEW_POINTS = 2000
# The series whose spikes the overview keeps (per bucket min and max of each).
OVERVIEW_SERIES = ("loss", "samples_per_s")


class SeriesMixin:
    """Store methods of the per-step tables (mixed into engine.store.Store)."""

    def write_metrics(self, run_id: str, rows: list[dict[str, Any]],
                      conn: sqlite3.Connection | None = None, token: str | None = None) -> None:
        """Insert metric rows and advance steps_completed, in one transaction.

        A run whose trainer has claimed it (engine.store.queue.claim_trainer) takes rows
        only with that trainer's `token`: a second trainer of the same run is refused
        with ClaimLost instead of mixing its steps into the first one's.
        """
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
                held = conn.execute("SELECT trainer_token FROM runs WHERE id = ?",
                                    (run_id,)).fetchone()
                if held is not None and held[0] is not None and held[0] != token:
                    raise ClaimLost(run_id)
                conn.executemany(
                    f"INSERT OR REPLACE INTO metrics (run_id, {','.join(METRIC_COLUMNS)})"
                    f" VALUES ({placeholders})",
                    values,
                )
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

        # pandas: the supervisor never reads series
        from engine.store.downsample import downsample_minmax

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
        # pandas: the supervisor never reads series
        from engine.store.downsample import downsample_minmax

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

        # pandas: the supervisor never reads series
        from engine.store.downsample import downsample_minmax

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
