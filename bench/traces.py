"""Trace analysis cost: time and peak memory of engine.traces.explain.analyze (parse +
Tensor-Core breakdown + time accounting + bound-by verdict) per trace fixture, side by side
with HolisticTraceAnalysis' temporal breakdown when HTA is installed.

    python -m bench.traces [TRACE ...] [--repeats 3] [--quick] [--no-big] [--json]

Target (issue 14): at most 0.6x HTA's time and at most its memory. Without HTA
(`pip install -r requirements-bench.txt`; it pulls Jupyter, no torch) the table says so
and `met` only says that every trace was analysed. Peak memory is tracemalloc's peak of
Python and NumPy allocations during one analysis, measured in a separate pass so tracing
does not slow the timed ones; the idle share of both tools is printed to show they
measured the same thing (HTA's window is the GPU's first to last kernel, ours the profiler
steps when the trace has them: see docs/precision-reference.md#time-accounting).

At scale: unless --quick or --no-big, a 1 GiB (decompressed) trace is built by repeating
the steps of the real V100 ResNet-50 trace (bench/_big_trace.py), and `python -m engine
kernels BIG --json` is timed as a whole process with its peak RSS (goal: under 8 s and
1 GiB), beside HTA's whole process on the same file (under an address-space limit, so
HTA running out of memory is reported, not the machine's). And the CLI's whole process on
the smallest fixture against HTA's whole process (goal: at most 0.5x).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable

from bench._common import REPO_ROOT, emit_json, machine_info, print_table

FIXTURES = REPO_ROOT / "tests" / "data" / "traces"
QUICK_FIXTURE = "h100_bert_small_tracelens.json.gz"
TIME_TARGET, MEMORY_TARGET = 0.6, 1.0
BIG_SOURCE = "v100_resnet50_kineto_v1.json.gz"
BIG_BYTES = 2**30
BIG_TIME_TARGET_S, BIG_MEMORY_TARGET_MIB = 8.0, 1024.0
SMALL_CLI_TARGET = 0.5
SET_RANKS = 16
HTA_ADDRESS_LIMIT = 8 * 2**30

# A fresh parent per measurement: RUSAGE_CHILDREN of this process would hold every
# earlier child's peak. The child gets `limit` bytes of address space (0: none).
_PROBE = """
import json, resource, subprocess, sys, time
limit = int(sys.argv[1])
def cap():
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
start = time.perf_counter()
try:
    r = subprocess.run(sys.argv[2:], capture_output=True, text=True, timeout=900,
                       preexec_fn=cap)
    rc, err = r.returncode, r.stderr[-400:]
except subprocess.TimeoutExpired:
    rc, err = None, "timed out after 900 s"
print(json.dumps({"rc": rc, "wall_s": time.perf_counter() - start, "stderr": err,
                  "peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""
_HTA_WHOLE = ("import sys\nfrom hta.trace_analysis import TraceAnalysis\n"
              "TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)\n")


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
    from engine.traces.explain import analyze

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


def _process(command: list[str], limit: int = 0) -> dict:
    """Wall time and peak RSS of `command` as a whole process."""
    result = subprocess.run([sys.executable, "-c", _PROBE, str(limit), *command],
                            cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=1000)
    return json.loads(result.stdout)


def _hta_installed() -> bool:
    try:
        import hta  # noqa: F401 - optional: requirements-bench.txt
    except ImportError:
        return False
    return True


def _hta_process(path: Path, workdir: Path) -> dict | str:
    if not _hta_installed():
        return "not installed"
    folder = workdir / f"hta-{path.name.split('.')[0]}"
    folder.mkdir(exist_ok=True)
    target = folder / path.name
    if not target.exists() and path.stat().st_dev == folder.stat().st_dev:
        os.link(path, target)  # the 1 GiB trace is not copied
    elif not target.exists():
        shutil.copy(path, target)
    measured = _process([sys.executable, "-c", _HTA_WHOLE, str(folder)], HTA_ADDRESS_LIMIT)
    if measured["rc"] != 0:
        reason = (measured["stderr"].strip().splitlines() or ["no message"])[-1][:160]
        return f"failed (rc {measured['rc']}, {HTA_ADDRESS_LIMIT // 2**30} GiB address " \
               f"space): {reason}"
    return measured


def _cli(path: Path) -> dict:
    return _process([sys.executable, "-m", "engine", "kernels", str(path), "--json"])


def measure_small_cli(workdir: Path) -> dict:
    """The CLI's whole process on the smallest fixture against HTA's, medians of 3."""
    path = min(FIXTURES.glob("*.json.gz"), key=lambda p: p.stat().st_size)
    ours = statistics.median(_cli(path)["wall_s"] for _ in range(3))
    row: dict[str, Any] = {"trace": path.name, "ours_s": ours}
    hta = [_hta_process(path, workdir) for _ in range(3)]
    if all(isinstance(h, dict) for h in hta):
        row["hta_s"] = statistics.median(h["wall_s"] for h in hta)
        row["ratio"] = ours / row["hta_s"]
        row["met"] = row["ratio"] <= SMALL_CLI_TARGET
    else:
        row["hta"] = next(h for h in hta if not isinstance(h, dict))
    return row


def measure_big(workdir: Path) -> dict:
    """Build the 1 GiB trace, run the CLI on it (and HTA), check the per-step figures
    are the source's repeated."""
    # late: the builder is only for this measurement
    from bench._big_trace import build
    from engine.traces.accounting import time_accounting

    big = workdir / "v100_repeated_1gib.json"
    built = build(FIXTURES / BIG_SOURCE, big, BIG_BYTES)
    ours = _cli(big)
    row: dict[str, Any] = {"trace": big.name, **built, "mib": built["bytes"] / 2**20,
                           "ours_rc": ours["rc"], "ours_s": ours["wall_s"],
                           "ours_peak_mib": ours["peak_mib"]}
    if ours["rc"] != 0:
        row["ours_error"] = ours["stderr"]
    row["met"] = ours["rc"] == 0 and ours["wall_s"] < BIG_TIME_TARGET_S and \
        ours["peak_mib"] < BIG_MEMORY_TARGET_MIB
    source_steps = [r["launched"]["busy_us"] for r in
                    time_accounting(FIXTURES / BIG_SOURCE)["steps"]]
    row["source_step_busy_ms"] = statistics.median(source_steps) / 1000
    hta = _hta_process(big, workdir)
    if isinstance(hta, dict):
        row.update(hta_s=hta["wall_s"], hta_peak_mib=hta["peak_mib"])
    else:
        row["hta"] = hta
    big.unlink(missing_ok=True)
    return row


def _ray_head(workdir: Path) -> tuple[str | None, str]:
    """A local Ray head with 2 CPUs for the set's Ray read: (address, "") or (None, why)."""
    if importlib.util.find_spec("ray") is None:
        return None, "Ray is not installed (pip install -r requirements-ray.txt)"
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray_cli = [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; "
               "sys.argv[0] = 'ray'; sys.exit(main())"]
    start = subprocess.run([*ray_cli, "start", "--head", "--node-ip-address", "127.0.0.1",
                            "--port", str(port), "--num-cpus", "2", "--num-gpus", "0",
                            "--include-dashboard=false", "--disable-usage-stats",
                            "--temp-dir", str(workdir / "ray")],
                           capture_output=True, text=True, timeout=180,
                           env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"))
    if start.returncode != 0:
        return None, f"ray start failed: {start.stderr[-300:]}"
    return f"127.0.0.1:{port}", ""


def measure_set(workdir: Path, ranks: int = SET_RANKS) -> dict:
    """One job of `ranks` 1 GiB rank traces (the big V100-built trace, hard-linked once per
    rank): the set read in one process, in 2 worker processes, and as Ray tasks on a local
    2-CPU head; the time per rank, and the projected time with N workers (ranks / N rounds
    of the 2-worker per-rank time, memory allowing)."""
    # late: the builder and the set paths are only for this measurement
    from bench._big_trace import build
    from engine.cluster.ray_traces import analyze_set_on_ray
    from engine.traces.set_workers import analyze_set_parallel
    from engine.traces.sets import analyze_set, set_members

    folder = workdir / "set"
    folder.mkdir()
    big = workdir / "rank-source.json"
    build(FIXTURES / BIG_SOURCE, big, BIG_BYTES)
    for rank in range(ranks):
        os.link(big, folder / f"rank-{rank}.json")
    members = set_members([folder])
    row: dict[str, Any] = {"ranks": ranks, "rank_mib": big.stat().st_size / 2**20}
    for label, run in (("one_process_s", lambda: analyze_set(members)),
                       ("two_workers_s", lambda: analyze_set_parallel(members, 2))):
        started = time.perf_counter()
        run()
        row[label] = time.perf_counter() - started
    address, why = _ray_head(workdir)
    if address:
        try:
            started = time.perf_counter()
            analyze_set_on_ray(members, address)
            row["ray_2cpu_s"] = time.perf_counter() - started
        finally:
            subprocess.run([sys.executable, "-c", "import sys; from ray.scripts.scripts import "
                            "main; sys.argv[0] = 'ray'; sys.exit(main())", "stop", "--force"],
                           capture_output=True, timeout=120)
    else:
        row["ray"] = why
    per_rank_s = row["two_workers_s"] * 2 / ranks  # a worker's time per rank, 2 at a time
    row["projected_s"] = {str(n): round(math.ceil(ranks / n) * per_rank_s, 1)
                          for n in (1, 2, 4, 8, 16, 64)}
    shutil.rmtree(folder, ignore_errors=True)
    big.unlink(missing_ok=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.traces")
    parser.add_argument("traces", nargs="*", type=Path, help="trace files (default: fixtures)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one small fixture, one repeat")
    parser.add_argument("--no-big", action="store_true",
                        help="skip the 1 GiB trace (built from the V100 fixture, ~1.1 GB of disk)")
    parser.add_argument("--set", action="store_true", dest="trace_set",
                        help=f"only a {SET_RANKS}-rank set of 1 GiB traces: one process, 2 "
                             "workers, a local Ray head; the projected time for N workers")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.trace_set:
        return _main_set(args)
    paths = args.traces or ([FIXTURES / QUICK_FIXTURE] if args.quick
                            else sorted(FIXTURES.glob("*.json.gz")))
    repeats = 1 if args.quick else max(1, args.repeats)
    started = time.perf_counter()
    big, small_cli = None, None
    with tempfile.TemporaryDirectory(prefix="precision-lab-bench-traces-") as tmp:
        rows = [measure(path, repeats, Path(tmp)) for path in paths]
        if not (args.quick or args.no_big or args.traces):
            small_cli = measure_small_cli(Path(tmp))
            big = measure_big(Path(tmp))
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
    if small_cli:
        print(f"\nWhole process on {small_cli['trace']}: ours {small_cli['ours_s']:.2f} s, HTA "
              + (f"{small_cli['hta_s']:.2f} s ({small_cli['ratio']:.2f}x; goal <= "
                 f"{SMALL_CLI_TARGET}x)" if "hta_s" in small_cli else small_cli["hta"]))
    if big:
        print(f"\n{big['mib']:.0f} MiB trace ({big['repeats']} x the V100 fixture, "
              f"{big['events']:,} events): engine kernels {big['ours_s']:.1f} s, peak RSS "
              f"{big['ours_peak_mib']:.0f} MiB (goal < {BIG_TIME_TARGET_S:.0f} s, < "
              f"{BIG_MEMORY_TARGET_MIB:.0f} MiB); HTA "
              + (f"{big['hta_s']:.1f} s, {big['hta_peak_mib']:.0f} MiB" if "hta_s" in big
                 else big["hta"]))
    if args.json:
        emit_json({"benchmark": "traces", "met": met, "repeats": repeats,
                   "target": f"time <= {TIME_TARGET}x HTA, memory <= {MEMORY_TARGET}x HTA",
                   "hta_compared": len(compared), "rows": rows, "big": big,
                   "small_cli": small_cli,
                   "elapsed_s": time.perf_counter() - started, "machine": machine_info()})
    return 0


def _main_set(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="precision-lab-bench-set-") as tmp:
        row = measure_set(Path(tmp))
    print(f"{row['ranks']} rank traces of {row['rank_mib']:.0f} MiB: one process "
          f"{row['one_process_s']:.1f} s, 2 worker processes {row['two_workers_s']:.1f} s, "
          + (f"Ray (local head, 2 CPUs) {row['ray_2cpu_s']:.1f} s" if "ray_2cpu_s" in row
             else f"Ray: {row['ray']}"))
    print("projected with N workers (memory allowing): " + ", ".join(
        f"{n}: {s:.0f} s" for n, s in row["projected_s"].items()))
    if args.json:
        emit_json({"benchmark": "traces_set", "set": row, "machine": machine_info()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
