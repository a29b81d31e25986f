"""The SQLite store: metric write throughput with 1 and 4 writer processes while a
reader polls, and read latency of the Live and Compare pages' queries at 20 runs x
100k steps.

    python -m bench.store [--runs 20 --steps 100000 --duration-s 2 --repeats 5] [--json]

Writes (target: >= 50k points/s; a point is one metric row, i.e. one logged step with
all its 16 values), by 1 and by 4 writer processes at once:
  batch      each calls `Store.write_metrics` with 500 rows per call (one transaction
             on a fresh connection each, as MetricBuffer's flush does) as fast as it can.
  batch-kept the same over one connection the writer keeps open (`conn=`): what the
             suggested MetricBuffer change would give.
  buffer     each pushes a row every 0.5 ms (a fast model logging every step) through a
             real `engine.run.session.MetricBuffer` (a flush every 0.5 s): does the store keep
             up, and how long does a flush stall the training loop.
While they write, this process polls `read_metrics(run, after_step=last_seen)` on the
first writer's run (the Live page's incremental read) and records its latency.

Reads (target: < 100 ms per downsampled series), on a store of finished runs built
once and cached (see bench/_dataset.py), median of `--repeats`:
  Live     read_metrics(run, max_points=2000) as the page calls it (all columns),
           the same with columns=["loss"], the incremental read after the last step,
           read_telemetry(run).
  Compare  read_metrics(run, max_points=2000, columns=["loss", "samples_per_s"]) for
           every run; engine.analysis.compare.metrics_frames for all runs at the page's points
           per run (the page's charts); engine.analysis.compare.summary_table for all runs (the
           page's table: finished runs' stored comparison stats, no metric rows).
  what-if  reading 2000 stored rows: what a precomputed per-run overview would cost.
The Live read is split into SQL fetch, DataFrame build and downsampling. The first
run on a machine also builds the 20 x 100k store (~30 s here) before the reads; later
runs reuse it and stay under a minute.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench._common import (
    REPO_ROOT,
    emit_json,
    machine_info,
    percentile,
    print_table,
    spread,
    subprocess_env,
)

TARGET_POINTS_PER_S = 50_000.0
TARGET_READ_MS = 100.0
BATCH_ROWS = 500
VALUES_PER_ROW = 16  # METRIC_COLUMNS minus step
BUFFER_ROW_INTERVAL_S = 0.0005  # "buffer" pattern: a 0.5 ms step logging every step
WRITE_MODES = ("batch", "batch-kept", "buffer")
MODE_LABELS = {
    "batch": "500 rows / write_metrics (today)",
    "batch-kept": "500 rows / write_metrics, kept conn",
    "buffer": "MetricBuffer, a row every 0.5 ms",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.store", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=100_000, help="logged steps per run")
    parser.add_argument("--duration-s", type=float, default=2.0,
                        help="seconds each write phase lasts (default 2)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats of each read")
    parser.add_argument("--cache-dir", default=None,
                        help="where the built store is cached (default: <tmp>/precision_lab_bench)")
    parser.add_argument("--skip-summary-table", action="store_true",
                        help="leave out engine.analysis.compare.summary_table")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 3 runs x 5k steps, 0.5 s write phases, 2 repeats")
    parser.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    parser.add_argument("--writer", metavar="HOME", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.steps, args.duration_s, args.repeats = 3, 5_000, 0.5, 2
    return args


# ---------------------------------------------------------------------------------------
# writer processes


def run_writer(home: str) -> None:
    """Body of a writer process (`--writer HOME`), kept for every write phase.

    Prepares rows, says "ready", then for each stdin line "MODE RUN_ID START_FILE
    DURATION_S": waits for the start time (written to START_FILE once every writer of
    the phase is ready), writes for DURATION_S, prints one JSON line. "quit" ends it.
    """
    import numpy as np

    from bench._dataset import metric_rows
    from engine.store import Store

    store = Store(home)
    # Rows are prepared before any clock starts: we time the store, not numpy.
    pool = metric_rows(1, 20_000, np.random.default_rng(0))
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            return
        mode, run_id, start_file, duration_s = line.split()
        print(json.dumps(_write(store, pool, mode, run_id, Path(start_file),
                                float(duration_s))), flush=True)


def _write(store, pool: list[dict], mode: str, run_id: str, start_file: Path,
           duration_s: float) -> dict[str, Any]:
    from engine.run.session import MetricBuffer

    while not start_file.exists():
        time.sleep(0.001)
    start_at = float(start_file.read_text())
    while time.time() < start_at:
        time.sleep(0.0005)
    end_at = start_at + duration_s
    txn_ms: list[float] = []
    step = 0

    def next_row() -> dict:
        nonlocal step
        row = dict(pool[step % len(pool)])
        step += 1
        row["step"] = step
        return row

    if mode in ("batch", "batch-kept"):
        with store.connect() as kept:
            conn = kept if mode == "batch-kept" else None
            while time.time() < end_at:
                batch = [next_row() for _ in range(BATCH_ROWS)]
                t = time.perf_counter()
                store.write_metrics(run_id, batch, conn=conn)
                txn_ms.append((time.perf_counter() - t) * 1000.0)
    else:  # "buffer": a training loop logging one row every BUFFER_ROW_INTERVAL_S
        buffer = MetricBuffer(store, run_id)
        real_flush = buffer.flush

        def timed_flush() -> None:  # the same flush; we note how long the caller waited
            t = time.perf_counter()
            real_flush()
            txn_ms.append((time.perf_counter() - t) * 1000.0)

        buffer.flush = timed_flush
        next_at = start_at
        while time.time() < end_at:
            buffer([next_row()])
            next_at += BUFFER_ROW_INTERVAL_S
            pause = next_at - time.time()
            if pause > 0:
                time.sleep(pause)
        buffer.flush()
    return {"rows": step, "elapsed_s": time.time() - start_at, "txn_ms": txn_ms}


class Writers:
    """Writer processes started once (start-up is pandas + engine imports) and reused."""

    def __init__(self, home: Path, count: int):
        self.home = home
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "bench.store", "--writer", str(home)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=str(REPO_ROOT), env=subprocess_env(home)) for _ in range(count)]
        for proc in self.procs:
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"writer failed to start: {line}{proc.stderr.read()[-2000:]}")

    def close(self) -> None:
        for proc in self.procs:
            try:
                proc.stdin.write("quit\n")
                proc.stdin.flush()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()

    def phase(self, store, writers: int, mode: str, duration_s: float,
              tag: str) -> dict[str, Any]:
        """`writers` of the processes write at once for `duration_s`; this process
        polls the first one's run as the Live page does, as fast as it can."""
        run_ids = [store.create_run(_config(), "cpu", "bench.store writer",
                                    run_id=f"write-{tag}-{i}") for i in range(writers)]
        start_file = self.home / f"start_{tag}"
        for proc, run_id in zip(self.procs, run_ids):
            proc.stdin.write(f"{mode} {run_id} {start_file} {duration_s}\n")
            proc.stdin.flush()
        start_at = time.time() + 0.05
        tmp = start_file.with_suffix(".tmp")
        tmp.write_text(repr(start_at))
        tmp.rename(start_file)  # atomic: a writer never reads half a number
        reads_ms: list[float] = []
        last_seen, read_rows = 0, 0
        while time.time() < start_at:
            time.sleep(0.0005)
        while time.time() < start_at + duration_s:
            t = time.perf_counter()
            fresh = store.read_metrics(run_ids[0], after_step=last_seen, max_points=None)
            reads_ms.append((time.perf_counter() - t) * 1000.0)
            if len(fresh):
                last_seen = int(fresh["step"].max())
                read_rows += len(fresh)
            time.sleep(0.02)
        results = []
        for proc in self.procs[:writers]:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"writer died: {proc.stderr.read()[-2000:]}")
            results.append(json.loads(line))
        rows = sum(r["rows"] for r in results)
        wall_s = max(r["elapsed_s"] for r in results)
        txn = [ms for r in results for ms in r["txn_ms"]]
        return {
            "mode": mode, "writers": writers, "rows": rows,
            "rows_stored": sum(store.metrics_count(run_id) for run_id in run_ids),
            "points_per_s": rows / wall_s, "values_per_s": rows * VALUES_PER_ROW / wall_s,
            "per_writer_points_per_s": [r["rows"] / r["elapsed_s"] for r in results],
            "txn_ms": {"median": percentile(txn, 50), "p95": percentile(txn, 95),
                       "max": max(txn) if txn else None, "n": len(txn)},
            "reader_ms": {"median": percentile(reads_ms, 50), "p95": percentile(reads_ms, 95),
                          "max": max(reads_ms) if reads_ms else None, "n": len(reads_ms)},
            "reader_rows_seen": read_rows,
        }


def _config():
    from engine.config import RunConfig

    return RunConfig(model="gpt", size="tiny", steps=1_000_000, profile=False)


# ---------------------------------------------------------------------------------------
# reads


def timed(fn: Callable[[], Any], repeats: int, warm: bool = True) -> tuple[dict[str, Any], Any]:
    """spread of the milliseconds of `repeats` calls (after one untimed call when `warm`:
    the OS page cache and lazy imports, as on a page's second visit), and the last result."""
    result = fn() if warm else None
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t) * 1000.0)
    return spread(times), result


def read_split(store, run_id: str, columns: list[str] | None, repeats: int) -> dict[str, Any]:
    """One downsampled read split into SQL fetch, DataFrame build and downsampling (ms)."""
    import pandas as pd

    from engine.schema import METRIC_COLUMNS
    from engine.store.downsample import downsample_minmax

    wanted = list(columns) if columns else list(METRIC_COLUMNS)
    selected = ["step"] + [c for c in wanted if c != "step"]
    sql = (f"SELECT {','.join(selected)} FROM metrics WHERE run_id = ? AND step > ?"
           " ORDER BY step")

    def fetch():
        with store.connect() as conn:
            return conn.execute(sql, (run_id, 0)).fetchall()

    def frame():
        with store.connect() as conn:
            return pd.read_sql_query(sql, conn, params=(run_id, 0))

    fetch_ms, rows = timed(fetch, repeats)
    frame_ms, df = timed(frame, repeats)
    numeric = [c for c in selected if c not in ("step", "phase", "wall_time_s")]
    down_ms, _ = timed(lambda: downsample_minmax(df, numeric, 2000), repeats)
    return {"columns": selected, "rows": len(rows), "sql_fetchall_ms": fetch_ms["median"],
            "read_sql_query_ms": frame_ms["median"], "downsample_ms": down_ms["median"]}


def read_phase(home: Path, run_ids: list[str], repeats: int,
               with_summary_table: bool) -> dict[str, Any]:
    import pandas as pd

    from engine.analysis.compare import summary_table
    from engine.analysis.steady import METRICS_FOR_CHARTS, chart_points_per_run, metrics_frames
    from engine.schema import METRIC_COLUMNS
    from engine.store import Store

    store = Store(home)
    live = run_ids[0]
    last_step = store.get_run(live).steps_completed
    reads: dict[str, dict[str, Any]] = {}
    reads["live: read_metrics(max_points=2000), all columns (the page's first read)"], df = \
        timed(lambda: store.read_metrics(live, max_points=2000), repeats)
    reads["live: read_metrics(max_points=2000, columns=[loss])"], _ = \
        timed(lambda: store.read_metrics(live, max_points=2000, columns=["loss"]), repeats)
    reads["live: read_metrics(after_step=last-10) (incremental)"], _ = \
        timed(lambda: store.read_metrics(live, after_step=last_step - 10, max_points=None),
              repeats)
    reads["live: read_telemetry(max_points=2000)"], _ = \
        timed(lambda: store.read_telemetry(live), repeats)
    # Each run once: 20 different runs are the repeats.
    per_series = [timed(lambda rid=run_id: store.read_metrics(
        rid, max_points=2000, columns=["loss", "samples_per_s"]), 1, warm=False)[0]["median"]
        for run_id in run_ids]
    reads["compare: read_metrics(max_points=2000, columns=[loss, samples_per_s]) per run"] = \
        spread(per_series)
    # The page's own calls, once each (seconds at this size).
    points = chart_points_per_run(len(run_ids))
    all_frames, _ = timed(lambda: metrics_frames(store, run_ids, max_points=points), 1,
                          warm=False)
    reads[f"compare: metrics_frames({len(run_ids)} runs), the page's charts"] = all_frames
    reads[f"compare: metrics_frames, per run (max_points={points}, "
          f"{len(METRICS_FOR_CHARTS)} columns)"] = {
        k: (v / len(run_ids) if isinstance(v, float) else v) for k, v in all_frames.items()}
    if with_summary_table:
        table, _ = timed(lambda: summary_table(store, run_ids), 1, warm=False)
        reads[f"compare: summary_table({len(run_ids)} runs), the page's table "
              "(stored stats)"] = table
    # What a precomputed <= 2000-row overview per finished run would cost to read.
    overview_sql = (f"SELECT {','.join(METRIC_COLUMNS)} FROM metrics WHERE run_id = ? "
                    "ORDER BY step LIMIT 2000")

    def read_overview():
        with store.connect() as conn:
            return pd.read_sql_query(overview_sql, conn, params=(live,))

    reads["what-if: read 2000 stored rows, all columns (a precomputed overview)"], _ = \
        timed(read_overview, repeats)
    split = {"live all columns": read_split(store, live, None, max(1, repeats // 2)),
             "loss only": read_split(store, live, ["loss"], max(1, repeats // 2))}
    return {"reads_ms": reads, "split_ms": split, "live_first_read_rows": len(df)}


# ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.writer:
        run_writer(args.writer)
        return 0
    machine = machine_info()
    started = time.monotonic()
    from bench._dataset import cached_store, describe
    from engine.store import Store

    phases = []
    with tempfile.TemporaryDirectory(prefix="bench_store_") as tmp:
        home = Path(tmp) / "home"
        store = Store(home)
        writers = Writers(home, 4)
        try:
            for mode in WRITE_MODES:
                for count in (1, 4):
                    phases.append(writers.phase(store, count, mode, args.duration_s,
                                                f"{mode}-{count}"))
        finally:
            writers.close()
    write_s = time.monotonic() - started

    data_home, info = cached_store(args.runs, args.steps,
                                   Path(args.cache_dir) if args.cache_dir else None)
    reads = read_phase(data_home, info["run_ids"], args.repeats, not args.skip_summary_table)
    elapsed_s = time.monotonic() - started

    batch = {p["writers"]: p for p in phases if p["mode"] == "batch"}
    write_met = all(batch[w]["points_per_s"] >= TARGET_POINTS_PER_S for w in (1, 4))
    downsampled = {k: v for k, v in reads["reads_ms"].items()
                   if "max_points=2000" in k and not k.startswith("what-if")}
    worst_key = max(downsampled, key=lambda k: downsampled[k]["median"] or 0.0)
    read_met = all((v["median"] or 0.0) < TARGET_READ_MS for v in downsampled.values())

    print(f"bench.store: write phases {write_s:.1f} s, total {elapsed_s:.1f} s; load avg at "
          f"start {machine['load_avg_1_5_15_min']}")
    print_table(f"Metric writes while a reader polls (points = metric rows; target >= "
                f"{TARGET_POINTS_PER_S:,.0f}/s)",
                ["pattern", "writers", "points/s", "values/s", "txn ms med", "p95",
                 "max", "reader ms med", "reader p95", "reader max"],
                [[MODE_LABELS[p["mode"]], p["writers"], p["points_per_s"],
                  p["values_per_s"], p["txn_ms"]["median"], p["txn_ms"]["p95"],
                  p["txn_ms"]["max"], p["reader_ms"]["median"], p["reader_ms"]["p95"],
                  p["reader_ms"]["max"]] for p in phases])
    print(f"\nRead store: {describe(info)}")
    print_table(f"Reads (ms, median of {args.repeats} [min..max]; target < {TARGET_READ_MS:.0f} ms "
                "per downsampled series)",
                ["query", "median", "min", "max"],
                [[k, v["median"], v["min"], v["max"]] for k, v in reads["reads_ms"].items()])
    print_table("Where a 100k-step read goes (ms, median)",
                ["read", "rows", "sqlite fetchall", "pd.read_sql_query", "downsample"],
                [[k, v["rows"], v["sql_fetchall_ms"], v["read_sql_query_ms"], v["downsample_ms"]]
                 for k, v in reads["split_ms"].items()])
    print(f"\nwrites: batch {batch[1]['points_per_s']:,.0f} points/s with 1 writer, "
          f"{batch[4]['points_per_s']:,.0f} with 4; target >= {TARGET_POINTS_PER_S:,.0f}: "
          f"{'met' if write_met else 'MISSED'}")
    print(f"reads: slowest downsampled series read {downsampled[worst_key]['median']:.1f} ms "
          f"({worst_key}); target < {TARGET_READ_MS:.0f} ms: {'met' if read_met else 'MISSED'}")
    if args.json:
        emit_json({
            "benchmark": "store", "met": write_met and read_met,
            "targets": {"points_per_s": TARGET_POINTS_PER_S, "read_ms": TARGET_READ_MS},
            "met_by_target": {"write_points_per_s": write_met, "read_ms": read_met},
            "points_per_s": {"1_writer": batch[1]["points_per_s"],
                             "4_writers": batch[4]["points_per_s"]},
            "worst_downsampled_read_ms": downsampled[worst_key]["median"],
            "worst_downsampled_read": worst_key,
            "writes": phases, "reads": reads, "dataset": info | {"run_ids": None},
            "config": {"runs": args.runs, "steps": args.steps, "duration_s": args.duration_s,
                       "batch_rows": BATCH_ROWS},
            "repeats": args.repeats, "elapsed_s": elapsed_s, "machine": machine,
        })
    return 0


if __name__ == "__main__":
    sys.exit(main())
