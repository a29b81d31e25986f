"""Why a GPU stream sat idle, how deep its launch queue ran and how long launches took to
start: HolisticTraceAnalysis's idle-time breakdown and queue-length analyses, per stream.

Definitions (docs/precision-reference.md#idle-time-by-cause, with where ours differ from
HTA's):
- An idle gap is the time between one kernel's end and the next kernel's start on the same
  stream (kernels only: copy-engine transfers run on their own engines), clipped to the
  window.
- **host wait**: the next kernel's launch call (cudaLaunchKernel / hipLaunchKernel) had
  not started when the previous kernel ended: nothing was queued, the GPU waited on the CPU.
- **kernel wait**: the next kernel was already queued and the gap is short (at most
  KERNEL_WAIT_US): the launch overhead between back-to-back kernels.
- **other**: queued and longer than that: cross-stream event waits, synchronisation, or
  causes the trace does not show.
- The **launch queue** of a stream at a time t: kernels whose launch call started by t
  and that have not finished by t; sampled at every launch call on the stream.
- **Launch delay**: a kernel's start minus its launch call's start.
Pure functions over engine.traces.parser.ParsedTrace, on numpy arrays; no pandas.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.traces.parser import ParsedTrace

# HTA's default threshold between kernel wait and other wait (its idle_time_breakdown).
KERNEL_WAIT_US = 30.0
# A stream whose queue rarely holds a second kernel while most of its idle time is host
# wait runs as fast as the CPU launches: launch-bound.
LAUNCH_BOUND_HOST_SHARE = 0.5
LAUNCH_BOUND_MEDIAN_QUEUE = 1


def _us(value: float) -> float:
    return round(value, 3)


def _stream_kernels(trace: ParsedTrace) -> list[tuple[Any, np.ndarray, np.ndarray, np.ndarray]]:
    """Per stream, in stream order: (stream, start_us, end_us, launch_us) as arrays sorted
    by start; launch_us is NaN where the kernel's launch call is not in the trace. Arrays,
    not Python loops: a 1 GiB trace holds a million kernels."""
    table = trace.table
    if table.empty:
        return []
    launch_start = {launch[0]: launch[2] for launch in trace.launches if launch[0] is not None}
    get = launch_start.get
    nan = math.nan
    starts = np.asarray(table["ts_us"].tolist(), dtype=np.float64)
    ends = starts + np.asarray(table["dur_us"].tolist(), dtype=np.float64)
    launches = np.fromiter((get(c, nan) if c is not None else nan
                            for c in table["correlation"]), dtype=np.float64, count=len(starts))
    streams = table["stream"].tolist()
    keys = sorted(set(streams), key=lambda key: (key is None, key or 0))
    code_of = {key: code for code, key in enumerate(keys)}
    codes = np.fromiter((code_of[key] for key in streams), dtype=np.int64, count=len(streams))
    # the kernel table is sorted by start; a stable sort by stream keeps that in each stream
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(keys) + 1))
    out = []
    for code, key in enumerate(keys):
        rows = order[bounds[code]:bounds[code + 1]]
        out.append((key, starts[rows], ends[rows], launches[rows]))
    return out


def _gap_causes(starts: np.ndarray, ends: np.ndarray, launches: np.ndarray, lo: float,
                hi: float, threshold_us: float) -> dict[str, float]:
    """Each gap after the latest end so far (a kernel may end after the next one ends),
    clipped to the window, by cause."""
    causes = {"host_wait_us": 0.0, "kernel_wait_us": 0.0, "other_us": 0.0}
    if len(starts) < 2:
        return causes
    last_end = np.maximum.accumulate(ends)[:-1]
    start = starts[1:]
    launch = launches[1:]
    gap = np.minimum(start, hi) - np.maximum(last_end, lo)
    idle = (start > last_end) & (gap > 0)
    with np.errstate(invalid="ignore"):  # NaN launches compare False: not queued, not host
        host = idle & (launch >= last_end)
        kernel = idle & ~host & ~np.isnan(launch) & (start - last_end <= threshold_us)
    other = idle & ~host & ~kernel
    causes["host_wait_us"] = float(gap[host].sum())
    causes["kernel_wait_us"] = float(gap[kernel].sum())
    causes["other_us"] = float(gap[other].sum())
    return causes


def _queue_lengths(ends: np.ndarray, launches: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """The queue at each launch call inside the window: launched by then, not yet ended
    (sorted)."""
    known = ~np.isnan(launches)
    launched = np.sort(launches[known])
    ended = np.sort(ends[known])
    done = np.searchsorted(ended, launched, side="right")  # ended by each launch call
    lengths = np.arange(1, len(launched) + 1) - done
    return np.sort(lengths[(launched >= lo) & (launched <= hi)])


def _percentile(ordered: list[float], share: float) -> float | None:
    """The `share` quantile of a sorted list (nearest rank below)."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _median_sorted(ordered: list) -> float | None:
    """statistics.median of a list already sorted (a million delays are sorted once)."""
    if not ordered:
        return None
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def stream_idle(trace: ParsedTrace, lo: float, hi: float,
                threshold_us: float = KERNEL_WAIT_US) -> list[dict]:
    """Per stream: idle time by cause, the launch queue (max, median) and launch delay
    (median, p95, max) over the window [lo, hi] (microseconds)."""
    rows = []
    for stream, starts, ends, launches in _stream_kernels(trace):
        inside = (ends > lo) & (starts < hi)
        if not inside.any():
            continue
        causes = _gap_causes(starts[inside], ends[inside], launches[inside], lo, hi,
                             threshold_us)
        idle = sum(causes.values())
        queue = _queue_lengths(ends, launches, lo, hi).tolist()
        delay = starts[inside] - launches[inside]
        with np.errstate(invalid="ignore"):
            delays = np.sort(delay[delay >= 0]).tolist()  # NaN (no launch) compares False
        median_queue = _median_sorted(queue)
        host_share = causes["host_wait_us"] / idle if idle else None
        rows.append({
            "stream": stream, "idle_us": _us(idle),
            **{key: _us(value) for key, value in causes.items()},
            "host_wait_share": host_share,
            "queue_max": queue[-1] if queue else None, "queue_p50": median_queue,
            "launch_delay_p50_us": _us(_median_sorted(delays)) if delays else None,
            "launch_delay_p95_us": _us(_percentile(delays, 0.95)) if delays else None,
            "launch_delay_max_us": _us(delays[-1]) if delays else None,
            "launch_bound": bool(host_share is not None and median_queue is not None
                                 and host_share > LAUNCH_BOUND_HOST_SHARE
                                 and median_queue <= LAUNCH_BOUND_MEDIAN_QUEUE),
        })
    return rows
