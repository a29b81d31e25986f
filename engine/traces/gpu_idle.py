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
Pure functions over engine.traces.parser.ParsedTrace; no pandas.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from engine.traces.parser import ParsedTrace

# HTA's default threshold between kernel wait and other wait (its idle_time_breakdown).
KERNEL_WAIT_US = 30.0
# A stream whose queue rarely holds a second kernel while most of its idle time is host
# wait runs as fast as the CPU launches: launch-bound.
LAUNCH_BOUND_HOST_SHARE = 0.5
LAUNCH_BOUND_MEDIAN_QUEUE = 1


def _us(value: float) -> float:
    return round(value, 3)


def _stream_kernels(trace: ParsedTrace) -> dict[Any, list[tuple[float, float, float | None]]]:
    """stream -> [(start_us, end_us, launch_us or None)] sorted by start."""
    table = trace.table
    launch_start = {launch[0]: launch[2] for launch in trace.launches if launch[0] is not None}
    by_stream: dict[Any, list] = defaultdict(list)
    if table.empty:
        return by_stream
    get = launch_start.get
    for stream, start, dur, correlation in zip(table["stream"], table["ts_us"],
                                               table["dur_us"], table["correlation"]):
        by_stream[stream].append((start, start + dur, get(correlation)))
    return by_stream  # the kernel table is sorted by start: so is every stream's list


def _gap_causes(kernels: list, lo: float, hi: float, threshold_us: float) -> dict[str, float]:
    causes = {"host_wait_us": 0.0, "kernel_wait_us": 0.0, "other_us": 0.0}
    last_end = None
    for start, end, launch in kernels:
        if last_end is not None and start > last_end:
            gap = min(start, hi) - max(last_end, lo)
            if gap > 0:
                if launch is not None and launch >= last_end:
                    causes["host_wait_us"] += gap
                elif launch is not None and start - last_end <= threshold_us:
                    causes["kernel_wait_us"] += gap
                else:
                    causes["other_us"] += gap
        last_end = end if last_end is None else max(last_end, end)
    return causes


def _queue_lengths(kernels: list, lo: float, hi: float) -> list[int]:
    """The queue at each launch call inside the window: launched by then, not yet ended."""
    launched = sorted(launch for _start, _end, launch in kernels if launch is not None)
    ended = sorted(end for _start, end, launch in kernels if launch is not None)
    lengths = []
    done = 0  # kernels ended by the current launch: a merge walk, both lists sorted
    total_ended = len(ended)
    for index, time_us in enumerate(launched):
        while done < total_ended and ended[done] <= time_us:
            done += 1
        if lo <= time_us <= hi:
            lengths.append(index + 1 - done)
    return lengths


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
    for stream, kernels in sorted(_stream_kernels(trace).items(),
                                  key=lambda kv: (kv[0] is None, kv[0] or 0)):
        inside = [k for k in kernels if k[1] > lo and k[0] < hi]
        if not inside:
            continue
        causes = _gap_causes(inside, lo, hi, threshold_us)
        idle = sum(causes.values())
        queue = sorted(_queue_lengths(kernels, lo, hi))
        delays = sorted(start - launch for start, _end, launch in inside
                        if launch is not None and start >= launch)
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
