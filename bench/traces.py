"""Trace analysis cost: time and peak memory of engine.analysis.explain.analyze (parse +
Tensor-Core breakdown + time accounting + bound-by verdict) per trace fixture, side by side
with HolisticTraceAnalysis' temporal breakdown when HTA is installed.

    python -m bench.traces [TRACE ...] [--repeats 3] [--quick] [--json]

Target (issue 14): at most 0.6x HTA's time and at most its memory. Without HTA
(`pip install -r requirements-bench.txt`; it pulls Jupyter, no torch) the table says so
and `met` only says that every trace was analysed. Peak memory is tracemalloc's peak of
Python and NumPy allocations during one analysis, measured in a separate pass so tracing
does not slow the timed ones; the idle share of both tools is printed to show they
measured the same thing (HTA's window is the GPU's first to last kernel, ours the profiler
steps when the trace has them: see docs/precision-reference.md#time-accounting).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable

from bench._common import REPO_ROOT, emit_json, machine_info, print_table

FIXTURES = REPO_ROOT / "tests" / "data" / "traces"
QUICK_FIXTURE = "h100_bert_small_tracelens.json.gz"
TIME_TARGET, MEMORY_TARGET = 0.6, 1.0


def _timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _peak_mib(fn: Callable[[], Any]) -> float:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def _ours(path: Path) -> Callable[[], dict]:
    # late: the parser and pandas load outside the timing
    from engine.analysis.explain import analyze

    return lambda: analyze(path)


def _hta(path: Path, workdir: Path) -> Callable[[], Any] | None:
    """HTA's temporal breakdown of one trace (HTA reads a directory of rank traces)."""
    try:
        from hta.trace_analysis import TraceAnalysis  # optional: requirements-bench.txt
    except ImportError:
        return None
    trace_dir = workdir / path.name.split(".")[0]
    trace_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, trace_dir / path.name)

    def run() -> Any:
        return TraceAnalysis(trace_dir=str(trace_dir)).get_temporal_breakdown(visualize=False)
    return run


def _hta_idle_share(frame: Any) -> float | None:
    try:
        column = next(c for c in frame.columns if str(c).startswith("idle_time_pctg"))
        return float(frame[column].iloc[0]) / 100.0
    except (StopIteration, AttributeError, IndexError, ValueError, TypeError):
        return None


def measure(path: Path, repeats: int, workdir: Path) -> dict:
    ours = _ours(path)
    seconds, result = _timed(ours, repeats)
    row = {"trace": path.name, "analysis_s": seconds, "peak_mib": _peak_mib(ours),
           "idle_share": result["idle_share"], "hta": "not installed"}
    hta = _hta(path, workdir)
    if hta is not None:
        try:
            hta_seconds, frame = _timed(hta, repeats)
            row.update(hta="ok", hta_s=hta_seconds, hta_peak_mib=_peak_mib(hta),
                       hta_idle_share=_hta_idle_share(frame))
            row["time_ratio"] = seconds / hta_seconds if hta_seconds else None
            row["memory_ratio"] = row["peak_mib"] / row["hta_peak_mib"] \
                if row["hta_peak_mib"] else None
        except Exception as exc:  # noqa: BLE001 - HTA fails on some traces; reported, not fatal
            row["hta"] = f"failed: {type(exc).__name__}: {str(exc)[:120]}"
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.traces")
    parser.add_argument("traces", nargs="*", type=Path, help="trace files (default: fixtures)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one small fixture, one repeat")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    paths = args.traces or ([FIXTURES / QUICK_FIXTURE] if args.quick
                            else sorted(FIXTURES.glob("*.json.gz")))
    repeats = 1 if args.quick else max(1, args.repeats)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="precision-lab-bench-traces-") as tmp:
        rows = [measure(path, repeats, Path(tmp)) for path in paths]
    print_table("Trace analysis: time and peak memory (HTA = HolisticTraceAnalysis temporal "
                "breakdown)",
                ["trace", "ours_s", "ours_MiB", "idle", "HTA_s", "HTA_MiB", "HTA_idle",
                 "time_x", "memory_x", "HTA"],
                [[r["trace"], r["analysis_s"], r["peak_mib"], r["idle_share"], r.get("hta_s"),
                  r.get("hta_peak_mib"), r.get("hta_idle_share"), r.get("time_ratio"),
                  r.get("memory_ratio"), r["hta"]] for r in rows])
    compared = [r for r in rows if r.get("time_ratio") is not None]
    met = all(r["time_ratio"] <= TIME_TARGET and (r.get("memory_ratio") or 0) <= MEMORY_TARGET
              for r in compared)
    if not compared:
        print("\nHTA is not installed (pip install -r requirements-bench.txt): no ratio to show.")
    if args.json:
        emit_json({"benchmark": "traces", "met": met, "repeats": repeats,
                   "target": f"time <= {TIME_TARGET}x HTA, memory <= {MEMORY_TARGET}x HTA",
                   "hta_compared": len(compared), "rows": rows,
                   "elapsed_s": time.perf_counter() - started, "machine": machine_info()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
