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
Pure functions over engine.traces.parser.ParsedTrace; no pandas or numpy (`engine kernels`
imports neither).
"""

from __future__ import annotations

import bisect
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


def _stream_kernels(trace: ParsedTrace) -> list[tuple[Any, list, list, list]]:
    """Per stream, in stream order: (stream, start_us, end_us, launch_us) as parallel lists
    sorted by start; launch_us is None where the kernel's launch call is not in the trace.
    Plain lists and local names: `engine kernels` imports no numpy, and a 1 GiB trace holds
    300k kernels."""
    table = trace.table
    if table.empty:
        return []
    launch_start = {launch[0]: launch[2] for launch in trace.launches if launch[0] is not None}
    get = launch_start.get
    by_stream: dict[Any, tuple[list, list, list]] = {}
    for stream, start, dur, correlation in zip(table["stream"], table["ts_us"],
                                               table["dur_us"], table["correlation"]):
        lists = by_stream.get(stream)
        if lists is None:
            lists = by_stream[stream] = ([], [], [])
        lists[0].append(start)
        lists[1].append(start + dur)
        lists[2].append(get(correlation))
    # the kernel table is sorted by start: so is every stream's list
    return [(stream, *by_stream[stream])
            for stream in sorted(by_stream, key=lambda key: (key is None, key or 0))]


def _gap_causes(starts: list, ends: list, launches: list, lo: float, hi: float,
                threshold_us: float) -> dict[str, float]:
    """Each gap after the latest end so far (a kernel may end after the next one ends),
    clipped to the window, by cause."""
    host = kernel = other = 0.0
    last_end = None
    for start, end, launch in zip(starts, ends, launches):
        if last_end is not None and start > last_end:
            gap = (start if start < hi else hi) - (last_end if last_end > lo else lo)
            if gap > 0:
                if launch is not None and launch >= last_end:
                    host += gap
                elif launch is not None and start - last_end <= threshold_us:
                    kernel += gap
                else:
                    other += gap
        if last_end is None or end > last_end:
            last_end = end
    return {"host_wait_us": host, "kernel_wait_us": kernel, "other_us": other}


def _queue_lengths(ends: list, launches: list, lo: float, hi: float) -> list[int]:
    """The queue at each launch call inside the window (launched by then, not yet
    ended), sorted."""
    if None in launches:  # a launch call outside the trace: that kernel is not counted
        launched = sorted(launch for launch in launches if launch is not None)
        ended = sorted(end for end, launch in zip(ends, launches) if launch is not None)
    else:
        launched, ended = sorted(launches), sorted(ends)
    lengths = []
    done = 0  # kernels ended by the current launch: a merge walk, both lists sorted
    total_ended = len(ended)
    for index, time_us in enumerate(launched):
        while done < total_ended and ended[done] <= time_us:
            done += 1
        if lo <= time_us <= hi:
            lengths.append(index + 1 - done)
    lengths.sort()
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
    for stream, starts, ends, launches in _stream_kernels(trace):
        # The kernels overlapping the window, by bisection on the sorted starts: those that
        # start after lo end after it too; of the others only those ending after lo count.
        before_hi = bisect.bisect_left(starts, hi)
        up_to_lo = min(bisect.bisect_right(starts, lo), before_hi)
        head = [index for index in range(up_to_lo) if ends[index] > lo]
        if not head and up_to_lo == before_hi:
            continue
        in_starts = [starts[index] for index in head] + starts[up_to_lo:before_hi]
        in_ends = [ends[index] for index in head] + ends[up_to_lo:before_hi]
        in_launches = [launches[index] for index in head] + launches[up_to_lo:before_hi]
        causes = _gap_causes(in_starts, in_ends, in_launches, lo, hi, threshold_us)
        idle = sum(causes.values())
        queue = _queue_lengths(ends, launches, lo, hi)
        delays = sorted(start - launch for start, launch in zip(in_starts, in_launches)
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
