"""Where a profiler window's time went: GPU busy and idle, copies, communication and its
overlap with compute, per stream and per profiler step; for CPU runs the same split from
the CPU ops' self time. Pure analysis over engine.traces.parser.ParsedTrace.

Definitions (docs/precision-reference.md#time-accounting):
- window: the span of the profiler steps (`ProfilerStep#N`, CPU side) when the trace has
  them, else first event start .. last event end. GPU work outside it is clipped off.
- busy_us: the union of kernel, memcpy and memset intervals over all streams; idle_us is
  the rest of the window. Summed kernel time (`kernel_us`) counts overlapping streams
  twice and is no wall time.
- parts_us: the window split into PARTS, adding up exactly to window_us. An instant where
  compute kernels run goes to them (shared between those running); communication counts
  only where no compute runs (what is hidden under compute costs the step nothing), copy-
  engine transfers only where neither runs; nothing running is idle.
- a step's time is the window divided by the number of steps (ProfilerStep spans, else
  `Optimizer.step#` spans, else 1).
"""

from __future__ import annotations

import bisect
import functools
import re
import statistics
from collections import defaultdict
from operator import itemgetter
from typing import Any

from engine.display import share_text
from engine.traces.gpu_idle import stream_idle
from engine.traces.parser import SPAN_PREFIXES, ParsedTrace, load_trace

PARTS = ("matrix", "attention", "elementwise", "normalisation", "copies", "communication",
         "optimizer", "other", "idle")
_KERNEL_PARTS = {"gemm": "matrix", "conv": "matrix", "attention": "attention",
                 "elementwise": "elementwise", "reduction/norm": "normalisation",
                 "softmax": "normalisation", "copy kernel": "copies", "memcpy/memset": "copies",
                 "communication": "communication", "optimizer": "optimizer", "other": "other"}
# Sweep priorities: 0 compute kernels, 1 communication kernels, 2 copy-engine events.
_COMPUTE, _COMM, _COPY_ENGINE = 0, 1, 2
_DIRECTION = re.compile(r"\b(HtoD|DtoH|DtoD|HtoH|PtoP|DtoA|AtoD)\b")
_SYNC_CALLS = re.compile(
    r"(?:cuda|hip)(?:Device|Stream|Event)Synchronize|(?:cuda|hip)Memcpy(?!Async)"
    r"|(?:cuda|hip)StreamWaitEvent"
)
SHORT_KERNEL_US = 10.0  # shorter than this, launch overhead (~5 us) is comparable


def _us(value: float) -> float:
    return round(float(value), 3)


def _share(part: float, whole: float) -> float | None:
    # 8 decimals: 4 would store 0.00004 as 0 and 0.99996 as 1, and a page would then
    # print "0 %" or "100 %" for a share that is neither
    return round(float(part) / float(whole), 8) if whole > 0 else None


# ---------------------------------------------------------------------------------------
# window and steps

def profiler_steps(trace: ParsedTrace) -> list[dict]:
    """ProfilerStep#N spans (CPU side), one per step number, in order."""
    by_number: dict[int, tuple[float, float]] = {}
    for name, start, end, *_ in trace.spans:
        if not name.startswith("ProfilerStep#"):
            continue
        try:
            number = int(name.split("#", 1)[1])
        except ValueError:
            continue
        known = by_number.get(number)
        if known is None or end - start > known[1] - known[0]:
            by_number[number] = (start, end)
    return [{"step": n, "start_us": s, "end_us": e} for n, (s, e) in sorted(by_number.items())]


def _event_span(trace: ParsedTrace) -> tuple[float, float] | None:
    starts, ends = [], []
    if not trace.table.empty:
        table_starts, durations = trace.table["ts_us"].tolist(), trace.table["dur_us"].tolist()
        starts.append(float(min(table_starts)))
        ends.append(float(max(start + dur for start, dur in zip(table_starts, durations))))
    for items, start_at, end_of in ((trace.copies, 1, lambda c: c[1] + c[2]),
                                    (trace.cpu_ops, 1, lambda o: o[2]),
                                    (trace.spans, 1, lambda s: s[2])):
        if items:
            starts.append(min(item[start_at] for item in items))
            ends.append(max(end_of(item) for item in items))
    if not starts:
        return None
    return min(starts), max(ends)


class StepNotInTrace(ValueError):
    """The step asked for is not among the trace's ProfilerStep#N markers."""


def _window(trace: ParsedTrace, step: int | None) -> dict:
    steps = profiler_steps(trace)
    if step is not None:
        chosen = [s for s in steps if s["step"] == step]
        if not chosen and not steps:
            raise StepNotInTrace(f"{trace.source}: no ProfilerStep#N markers in this trace, so no "
                             f"step {step} to pick; leave the step out for the whole window")
        if not chosen:
            known = ", ".join(str(s["step"]) for s in steps)
            raise StepNotInTrace(f"{trace.source}: no ProfilerStep#{step} in this trace "
                             f"(steps recorded: {known}); pick one of those, or leave the "
                             "step out for the whole window")
        steps = chosen
    if steps:
        start, end = steps[0]["start_us"], steps[-1]["end_us"]
        return {"source": "profiler steps", "start_us": start, "end_us": end,
                "window_us": end - start, "step_count": len(steps), "steps": steps}
    span = _event_span(trace)
    start, end = span if span else (0.0, 0.0)
    optimizer_steps = sum(1 for s in trace.spans if s[0].startswith("Optimizer.step#")
                          and start <= s[1] <= end)
    return {"source": "first to last event", "start_us": start, "end_us": end,
            "window_us": end - start, "step_count": max(1, optimizer_steps), "steps": []}


# ---------------------------------------------------------------------------------------
# GPU: one sweep over all activities gives unions, overlaps and the exclusive split

def _as_id(value: Any) -> int | None:  # a launch's correlation: int, text or None
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


class _Activities:
    """Every kernel and copy-engine event as a sweep item (start, end, part, priority),
    sorted by start, with the correlation id that pairs it with its runtime launch call:
    a window's items are found by bisection, not by a pass over all of them (a 1 GiB
    trace has 200 steps and 300k kernels)."""

    def __init__(self, trace: ParsedTrace):
        table = trace.table
        kinds = {category: (_KERNEL_PARTS.get(category, "other"),
                            _COMM if _KERNEL_PARTS.get(category) == "communication" else _COMPUTE)
                 for category in set(table["category"].tolist())}
        # comprehensions, not a loop of appends: this runs once per kernel (300k per GiB)
        rows = [(start, start + dur) + kinds[category]
                + (correlation if isinstance(correlation, int) else None,)
                for start, dur, category, correlation in zip(
                    table["ts_us"].tolist(), table["dur_us"].tolist(),
                    table["category"].tolist(), table["correlation"].tolist())]
        rows += [(copy[1], copy[1] + copy[2], "copies", _COPY_ENGINE,
                  _as_id(copy[7]) if len(copy) > 7 else None) for copy in trace.copies]
        rows.sort(key=itemgetter(0))  # kernels come sorted: the copies are merged in
        self.items = [row[:4] for row in rows]
        self.correlations = [row[4] for row in rows]
        self.starts = [row[0] for row in rows]
        self.longest_us = max((row[1] - row[0] for row in rows), default=0.0)

    def within(self, lo: float, hi: float) -> list[tuple[float, float, str, int]]:
        """The items that may overlap [lo, hi] (the sweep clips them)."""
        first = bisect.bisect_left(self.starts, lo - self.longest_us)
        return self.items[first:bisect.bisect_left(self.starts, hi)]

    def span(self) -> tuple[float, float] | None:
        """The GPU's own span: first activity start .. last activity end."""
        if not self.items:
            return None
        return self.items[0][0], max(item[1] for item in self.items)


def _sweep(items: list[tuple[float, float, str, int]], lo: float, hi: float) -> dict:
    """Unions, overlaps, exclusive part times and idle gaps of `items` within [lo, hi].

    One pass over the sorted start/end points; between two points the activity is
    constant. An instant where compute runs goes to the compute parts (shared by count),
    communication only where no compute runs, copies only where neither does."""
    part_index = {part: i for i, part in enumerate(PARTS)}
    points = []
    append = points.append
    for start, end, part, priority in items:
        # clipped with comparisons, not max()/min(): two builtin calls per activity were a
        # sixth of the sweep
        if start < lo:
            start = lo
        if end > hi:
            end = hi
        if end > start:
            index = part_index[part]
            append((start, 1, index, priority))
            append((end, -1, index, priority))
    points.sort()  # by time, ends (-1) before starts (+1) at the same instant
    counts = [[0] * len(PARTS) for _ in range(3)]
    totals = [0, 0, 0]
    parts = [0.0] * len(PARTS)
    busy = compute_us = comm_us = copy_us = overlap_us = copy_overlap_us = 0.0
    gaps: list[float] = []  # idle stretches between two busy ones
    pending_gap, seen_busy = 0.0, False
    previous = lo
    points.append((hi, 0, 0, 0))
    # the segment accounting inlined: this loop runs twice per activity (1.2 M times for
    # a 1 GiB trace), and a call per segment was a fifth of the whole analysis
    for time_us, delta, part, priority in points:
        segment = time_us - previous
        if segment > 0:
            compute, comm, copy = totals[0] > 0, totals[1] > 0, totals[2] > 0
            if compute or comm or copy:
                busy += segment
                if compute:
                    compute_us += segment
                    if comm:
                        overlap_us += segment
                if comm:
                    comm_us += segment
                if copy:
                    copy_us += segment
                    if compute or comm:
                        copy_overlap_us += segment
                level = _COMPUTE if compute else (_COMM if comm else _COPY_ENGINE)
                active = totals[level]
                for index, count in enumerate(counts[level]):
                    if count:
                        parts[index] += segment * count / active
                if seen_busy and pending_gap > 0:
                    gaps.append(pending_gap)
                seen_busy, pending_gap = True, 0.0
            else:
                pending_gap += segment
        counts[priority][part] += delta
        totals[priority] += delta
        if time_us > previous:
            previous = time_us
    parts[part_index["idle"]] = max(0.0, (hi - lo) - busy)
    return {"busy": busy, "compute": compute_us, "communication": comm_us, "copy": copy_us,
            "overlap": overlap_us, "copy_overlap": copy_overlap_us,
            "parts": dict(zip(PARTS, parts)), "gaps": gaps}


def _merged_length(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    total, current_end = 0.0, lo
    for start, end in sorted(intervals):
        if start < current_end:
            start = current_end
        if end > hi:
            end = hi
        if end > start:
            total += end - start
            current_end = end
    return total


def _stream_table(trace: ParsedTrace, lo: float, hi: float, window_us: float) -> list[dict]:
    rows: dict[Any, dict] = defaultdict(lambda: {"kernel_count": 0, "kernel_us": 0.0,
                                                 "memcpy_count": 0, "memcpy_us": 0.0,
                                                 "memset_count": 0, "memset_us": 0.0,
                                                 "intervals": []})
    table = trace.table
    if not table.empty:
        for stream, start, dur in zip(table["stream"].tolist(), table["ts_us"].tolist(),
                                      table["dur_us"].tolist()):
            clipped = min(start + dur, hi) - max(start, lo)
            if clipped > 0:
                row = rows[int(stream) if isinstance(stream, int) else None]
                row["kernel_count"] += 1
                row["kernel_us"] += clipped
                row["intervals"].append((start, start + dur))
    for name, start, dur, stream, _device, _size, kind, *_ in trace.copies:
        clipped = min(start + dur, hi) - max(start, lo)
        if clipped > 0:
            row = rows[stream]
            row[f"{kind}_count"] += 1
            row[f"{kind}_us"] += clipped
            row["intervals"].append((start, start + dur))
    result = []
    for stream, row in sorted(rows.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        busy = _merged_length(row.pop("intervals"), lo, hi)
        result.append({"stream": stream, **{k: (_us(v) if k.endswith("_us") else v)
                                            for k, v in row.items()},
                       "busy_us": _us(busy), "busy_share": _share(busy, window_us)})
    return result


def _copy_table(trace: ParsedTrace, lo: float, hi: float) -> list[dict]:
    """Copy-engine events by direction: count, bytes, time and achieved GB/s."""
    rows: dict[str, dict] = defaultdict(lambda: {"count": 0, "bytes": 0, "us": 0.0,
                                                 "bytes_known": True})
    for name, start, dur, _stream, _device, size, kind, *_ in trace.copies:
        if start + dur < lo or start > hi:
            continue
        match = _DIRECTION.search(name)
        direction = "memset" if kind == "memset" else (match.group(1) if match else "other")
        row = rows[direction]
        row["count"] += 1
        row["us"] += dur
        if size is None:
            row["bytes_known"] = False
        else:
            row["bytes"] += size
    return [{"direction": direction, "count": row["count"],
             "bytes": row["bytes"] if row["bytes_known"] else None, "us": _us(row["us"]),
             # bytes per us is MB/s: / 1e3 for GB/s
             "gb_per_s": round(row["bytes"] / row["us"] / 1e3, 3)
             if row["bytes_known"] and row["us"] > 0 else None}
            for direction, row in sorted(rows.items(), key=lambda kv: -kv[1]["us"])]


def _spans_union(trace: ParsedTrace, prefix: str, lo: float, hi: float) -> float:
    return _merged_length([(s[1], s[2]) for s in trace.spans if s[0].startswith(prefix)], lo, hi)


@functools.lru_cache(maxsize=4096)
def _is_sync_call(name: str) -> bool:
    return bool(_SYNC_CALLS.search(name))  # a trace has a few dozen runtime call names


def _sync_calls(trace: ParsedTrace, lo: float, hi: float) -> tuple[int, float]:
    count, total = 0, 0.0
    for launch in trace.launches:
        if lo <= launch[2] <= hi and _is_sync_call(launch[5]):
            count += 1
            total += launch[6]
    return count, total


def step_kernel_table(trace: ParsedTrace, step: int):
    """The kernels that started in ProfilerStep#`step` (the ones its accounting counts),
    with the table's attrs: the Tensor-Core breakdown of that step alone."""
    window = _window(trace, step)
    lo, hi = window["start_us"], window["end_us"]
    return trace.table.rows(i for i, start in enumerate(trace.table["ts_us"].tolist())
                            if lo <= start < hi)


def _kernel_figures(trace: ParsedTrace, lo: float, hi: float) -> dict:
    table = trace.table
    if table.empty:
        return {"kernel_count": 0, "kernel_us": 0.0, "conv_kernel_us": 0.0,
                "median_kernel_us": None, "short_kernel_share": None}
    inside = [(dur, category) for start, dur, category in zip(
        table["ts_us"].tolist(), table["dur_us"].tolist(), table["category"].tolist())
        if lo <= start < hi]
    durations = [dur for dur, _ in inside]
    return {"kernel_count": len(inside), "kernel_us": _us(sum(durations)),
            "conv_kernel_us": _us(sum(dur for dur, category in inside if category == "conv")),
            "median_kernel_us": _us(statistics.median(durations)) if inside else None,
            "short_kernel_share": _share(sum(1 for dur in durations if dur < SHORT_KERNEL_US),
                                         len(inside))}


def _gpu_window_figures(items, lo: float, hi: float) -> dict:
    swept = _sweep(items, lo, hi)
    window_us = hi - lo
    return {"window_us": _us(window_us), "busy_us": _us(swept["busy"]),
            "idle_us": _us(max(0.0, window_us - swept["busy"])),
            "idle_share": _share(max(0.0, window_us - swept["busy"]), window_us),
            "compute_us": _us(swept["compute"]), "communication_us": _us(swept["communication"]),
            "copy_us": _us(swept["copy"]), "overlap_us": _us(swept["overlap"]),
            "exposed_communication_us": _us(swept["communication"] - swept["overlap"]),
            "copy_overlap_us": _us(swept["copy_overlap"]),
            "parts_us": {part: _us(us) for part, us in swept["parts"].items()},
            # shares rounded once, here: a page or the CLI that divided the rounded times
            # again could print 99.8 % next to an idle_share that reads 99.9 %
            "parts_share": {part: _share(us, window_us) for part, us in swept["parts"].items()},
            "_gaps": swept["gaps"]}


# ---------------------------------------------------------------------------------------
# GPU work by the step that launched it

def _by_launch(trace: ParsedTrace, activities: _Activities, steps: list[dict]
               ) -> tuple[list[list], list, list]:
    """Each activity to the ProfilerStep whose CPU span holds the runtime call that
    launched it (args.correlation pairs kernel and call), whatever the GPU's lag.
    -> (items per step, items launched outside every step, items with no launch event:
    launched before the profiler started, or a trace without correlation ids)."""
    launched_at = {}
    for launch in trace.launches:
        correlation = _as_id(launch[0])
        if correlation is not None:
            launched_at[correlation] = launch[2]
    starts = [entry["start_us"] for entry in steps]
    per_step: list[list] = [[] for _ in steps]
    outside, unlaunched = [], []
    for item, correlation in zip(activities.items, activities.correlations):
        time_us = launched_at.get(correlation) if correlation is not None else None
        if time_us is None:
            unlaunched.append(item)
            continue
        index = bisect.bisect_right(starts, time_us) - 1
        if index >= 0 and time_us <= steps[index]["end_us"]:
            per_step[index].append(item)
        else:
            outside.append(item)
    return per_step, outside, unlaunched


def _own_span_figures(items: list, step_start_us: float | None = None) -> dict:
    """Busy and idle of `items` over their own span (first start .. last end): the idle
    HolisticTraceAnalysis reports, beside the idle within the CPU-side step."""
    if not items:
        return {"activity_count": 0, "busy_us": 0.0, "gpu_start_us": None, "gpu_end_us": None,
                "gpu_span_us": None, "idle_in_gpu_span_us": None,
                "idle_in_gpu_span_share": None, "gpu_lag_us": None}
    lo, hi = min(item[0] for item in items), max(item[1] for item in items)
    busy = _merged_length([item[:2] for item in items], lo, hi)
    return {"activity_count": len(items), "busy_us": _us(busy), "gpu_start_us": _us(lo),
            "gpu_end_us": _us(hi), "gpu_span_us": _us(hi - lo),
            "idle_in_gpu_span_us": _us(max(0.0, hi - lo - busy)),
            "idle_in_gpu_span_share": _share(max(0.0, hi - lo - busy), hi - lo),
            # how long after its step began the step's first GPU work started
            "gpu_lag_us": _us(lo - step_start_us) if step_start_us is not None else None}


def _launch_summary(per_step: list[list], outside: list, unlaunched: list,
                    gpu_busy_us: float) -> dict:
    """GPU busy time launched inside the steps, outside every step, and with no launch
    event, each as a share of the GPU's busy time over its own span."""
    attributed = [item for items in per_step for item in items]

    def part(items: list, busy: float | None = None) -> dict:
        busy = _own_span_figures(items)["busy_us"] if busy is None else busy
        return {"activity_count": len(items), "busy_us": busy,
                "share_of_gpu_busy": _share(busy, gpu_busy_us)}
    # all of it launched in steps (the usual case): its union is the GPU's, swept already
    return {"in_steps": part(attributed, None if outside or unlaunched else gpu_busy_us),
            "outside_steps": part(outside), "no_launch_event": part(unlaunched)}


def gpu_accounting(trace: ParsedTrace, step: int | None = None) -> dict:
    window = _window(trace, step)
    lo, hi, window_us = window["start_us"], window["end_us"], window["window_us"]
    activities = _Activities(trace)
    figures = _gpu_window_figures(activities.within(lo, hi), lo, hi)
    gaps = figures.pop("_gaps")
    all_steps = profiler_steps(trace)
    per_step, outside, unlaunched = _by_launch(trace, activities, all_steps)
    launched = {entry["step"]: items for entry, items in zip(all_steps, per_step)}
    steps = []
    for entry in window["steps"]:
        one = _gpu_window_figures(activities.within(entry["start_us"], entry["end_us"]),
                                  entry["start_us"], entry["end_us"])
        one.pop("_gaps")
        steps.append({"step": entry["step"], "start_us": _us(entry["start_us"]),
                      "step_time_us": one.pop("window_us"), **one,
                      "launched": _own_span_figures(launched.get(entry["step"], []),
                                                    entry["start_us"])})
    span = activities.span()
    gpu_span = _own_span_figures(activities.items) if span else None
    sync_count, sync_us = _sync_calls(trace, lo, hi)
    count = window["step_count"]
    return {
        "kind": "gpu",
        "chosen_step": step,  # None: the whole window
        "window": {k: (_us(v) if k.endswith("_us") else v) for k, v in window.items()
                   if k != "steps"},
        "step_time_us": _us(window_us / count) if count else None,
        **figures,
        "busy_share": _share(figures["busy_us"], window_us),
        **_kernel_figures(trace, lo, hi),
        "idle_gaps": {"count": len(gaps), "median_us": _us(statistics.median(gaps)) if gaps
                      else None, "total_us": _us(sum(gaps))},
        "copies": _copy_table(trace, lo, hi),
        "streams": _stream_table(trace, lo, hi, window_us),
        # why each stream sat idle, its launch queue and launch delays (HTA's analyses)
        "stream_idle": stream_idle(trace, lo, hi),
        "steps": steps,
        # The GPU's own span and the work by launching step: the window above is the
        # CPU-side steps, and time-clipping GPU work to it counts what an earlier step
        # launched and leaves out what ran after (docs/precision-reference.md#time-accounting)
        "gpu_span": gpu_span,
        "by_launch": _launch_summary(per_step, outside, unlaunched, gpu_span["busy_us"])
        if all_steps and gpu_span else None,
        "parts_per_step_us": {p: _us(us / count) for p, us in figures["parts_us"].items()},
        "data_loader_us": _us(_spans_union(trace, "enumerate(DataLoader)", lo, hi)),
        "optimizer_span_us": _us(_spans_union(trace, "Optimizer.step#", lo, hi)),
        "sync_calls": sync_count, "sync_us": _us(sync_us),
        "defects": dict(trace.defects),
    }


# ---------------------------------------------------------------------------------------
# CPU: self time of CPU ops on the main thread, split into the same parts

_CPU_MATRIX = re.compile(r"^aten::(?:_?(?:mm|addmm|bmm|baddbmm|addbmm|matmul|linear|addmv|mv|dot"
                         r"|vdot|einsum|_addmm_activation|linear_backward)|\w*conv\w*"
                         r"|mkldnn_\w+|_mkldnn\w*)$|^mkldnn::")
_CPU_ATTENTION = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|attention")
CAST_OPS = ("aten::to", "aten::_to_copy", "aten::copy_")
_CPU_COPIES = re.compile(r"^aten::(?:to|_to_copy|copy_|_copy_from\w*|clone|contiguous|cat"
                         r"|stack)$")
_CPU_NORM = re.compile(r"norm|softmax|^aten::(?:sum|mean|var\w*|std\w*|amax|amin|max|min"
                       r"|nll_loss\w*|cross_entropy\w*|mse_loss\w*)$")
_CPU_COMM = re.compile(r"c10d::|nccl|gloo|all_?reduce|all_?gather|reduce_?scatter|broadcast"
                       r"|record_param_comms")
_CPU_OPTIMIZER = re.compile(r"^aten::_foreach_|^aten::_fused_(?:adam|sgd)|^Optimizer\.")
# Views and allocations: their time belongs to the op that asked for them.
_CPU_INHERIT = re.compile(r"^aten::(?:as_strided|empty\w*|zeros\w*|t|transpose|view\w*|reshape"
                          r"|_reshape_alias|expand\w*|resolve_conj|resolve_neg|detach_?"
                          r"|unsqueeze|squeeze|permute|select|slice|alias|_unsafe_view"
                          r"|lift_fresh|result_type|numpy_T|set_)$|^detach$")


def cpu_op_part(name: str) -> str | None:
    """The part of a CPU op by its name; None for views/allocations that inherit the part
    of the op they run under."""
    if _CPU_INHERIT.search(name):
        return None
    for part, pattern in (("optimizer", _CPU_OPTIMIZER), ("communication", _CPU_COMM),
                          ("copies", _CPU_COPIES), ("attention", _CPU_ATTENTION),
                          ("matrix", _CPU_MATRIX), ("normalisation", _CPU_NORM)):
        if pattern.search(name):
            return part
    return "elementwise" if name.startswith("aten::") else "other"


def _exclusive_times(ops: list, lo: float, hi: float, optimizer_spans: list) -> tuple[dict, dict]:
    """Self time per (op name, part) on one thread: each instant goes to the innermost op
    open then, so the sums add up to the union of the ops (nothing counted twice)."""
    ops = sorted(ops, key=lambda op: (op[1], -op[2]))
    starts = [s[0] for s in optimizer_spans]
    by_op: dict[tuple[str, str], list] = defaultdict(lambda: [0.0, 0])
    cast_us = [0.0]
    stack: list[list] = []  # [end, name, part, is_cast]
    cursor = lo

    def credit(frame: list, until: float) -> None:
        nonlocal cursor
        if until > cursor:
            by_op[(frame[1], frame[2])][0] += until - cursor
            if frame[3]:
                cast_us[0] += until - cursor
            cursor = until

    for name, start, end, *_ in ops:
        start, end = max(start, lo), min(end, hi)
        if end < start or start >= hi:
            continue
        while stack and stack[-1][0] <= start:
            credit(stack[-1], stack[-1][0])
            stack.pop()
        if stack:
            credit(stack[-1], start)
            end = min(end, stack[-1][0])  # a child never outlives its parent
        cursor = max(cursor, start)
        part = cpu_op_part(name)
        parent = stack[-1] if stack else None
        if _inside(starts, optimizer_spans, start):
            part = "optimizer"
        elif part is None or (parent is not None and parent[2] == "copies" and parent[3]):
            part = parent[2] if parent is not None else "other"
        is_cast = name in CAST_OPS or bool(parent and parent[3])
        by_op[(name, part)][1] += 1
        stack.append([end, name, part, is_cast])
    while stack:
        credit(stack[-1], stack[-1][0])
        stack.pop()
    return by_op, {"cast_us": cast_us[0]}


def _inside(starts: list[float], spans: list, time_us: float) -> bool:
    index = bisect.bisect_right(starts, time_us) - 1
    return index >= 0 and spans[index][0] <= time_us <= spans[index][1]


def _main_thread(ops: list) -> tuple[Any, Any] | None:
    busy: dict[tuple, list] = defaultdict(list)
    for op in ops:
        busy[(op[3], op[4])].append((op[1], op[2]))
    if not busy:
        return None
    return max(busy, key=lambda key: _merged_length(busy[key], float("-inf"), float("inf")))


def cpu_accounting(trace: ParsedTrace, step: int | None = None,
                   cpu_evidence: dict | None = None) -> dict:
    window = _window(trace, step)
    lo, hi, window_us = window["start_us"], window["end_us"], window["window_us"]
    ops = [op for op in trace.cpu_ops if not op[0].startswith(SPAN_PREFIXES)]
    main = _main_thread(ops)
    main_ops = [op for op in ops if (op[3], op[4]) == main]
    optimizer_spans = sorted((s[1], s[2]) for s in trace.spans
                             if s[0].startswith(("Optimizer.step#", "Optimizer.zero_grad#"))
                             and (s[3], s[4]) == main)
    by_op, extra = _exclusive_times(main_ops, lo, hi, optimizer_spans)
    parts = {part: 0.0 for part in PARTS}
    for (_name, part), (self_us, _count) in by_op.items():
        parts[part] += self_us
    busy = sum(parts.values())
    parts["idle"] = max(0.0, window_us - busy)
    count = window["step_count"]
    top = sorted(by_op.items(), key=lambda kv: -kv[1][0])
    return {
        "kind": "cpu",
        "window": {k: (_us(v) if k.endswith("_us") else v) for k, v in window.items()
                   if k != "steps"},
        "step_time_us": _us(window_us / count) if count else None,
        "window_us": _us(window_us),
        "busy_us": _us(busy), "idle_us": _us(parts["idle"]),
        "idle_share": _share(parts["idle"], window_us),
        "busy_share": _share(busy, window_us),
        "parts_us": {p: _us(us) for p, us in parts.items()},
        "parts_share": {p: _share(us, window_us) for p, us in parts.items()},
        "parts_per_step_us": {p: _us(us / count) for p, us in parts.items()},
        "cast_us": _us(extra["cast_us"]), "cast_share": _share(extra["cast_us"], window_us),
        "ops": [{"cpu_op": name, "part": part, "self_us": _us(us), "count": n}
                for (name, part), (us, n) in top[:25]],
        "matrix_ops": _matrix_ops(top, cpu_evidence),
        "thread_count": len({(op[3], op[4]) for op in ops}),
        "data_loader_us": _us(_spans_union(trace, "enumerate(DataLoader)", lo, hi)),
        "defects": dict(trace.defects),
        "steps": [],
    }


def _matrix_ops(top: list, cpu_evidence: dict | None) -> list[dict]:
    """Matrix ops by self time with the oneDNN primitives of their kind that the run's
    verbose log recorded (convolutions -> convolution primitives, the rest -> matmul /
    inner_product); the profiler does not link an op to its primitive, the kind does."""
    primitives = (cpu_evidence or {}).get("primitives") or []
    by_kind: dict[str, set[str]] = defaultdict(set)
    for primitive in primitives:
        by_kind[str(primitive.get("kind"))].add(
            f"{primitive.get('kind')} {primitive.get('src_dtype')} "
            f"{primitive.get('implementation')}"
        )
    rows = []
    for (name, part), (us, n) in top:
        if part != "matrix" or not _CPU_MATRIX.search(name):
            continue
        kinds = ("convolution", "deconvolution") if "conv" in name else ("matmul", "inner_product")
        found = sorted(set().union(*(by_kind[k] for k in kinds)))
        if cpu_evidence is None:
            onednn = "no oneDNN verbose log for this trace"
        elif found:
            onednn = "; ".join(found[:3])
        else:
            onednn = "no oneDNN primitive recorded: MKL or ATen's own kernel"
        rows.append({"cpu_op": name, "self_us": _us(us), "count": n, "onednn": onednn})
    return rows[:15]


# ---------------------------------------------------------------------------------------
# public

def _ms_text(us: float) -> str:
    return f"{us / 1000:,.2f} ms"


def _pct_text(share: float) -> str:
    return share_text(share, 1)


def launch_words(accounting: dict) -> list[str]:
    """The GPU-span and by-launch figures as sentences, the same on the Kernels page and in
    `engine kernels`: the window above them is the CPU-side steps, and these say what that
    window leaves out or counts from elsewhere."""
    words = []
    span = accounting.get("gpu_span")
    # with one step chosen, these two still cover the whole trace: said so
    whole = " in the whole trace" if accounting.get("chosen_step") is not None else ""
    if span and span.get("gpu_span_us"):
        words.append(f"Over the GPU's own span{whole} (first to last kernel or copy, the window "
                     f"HolisticTraceAnalysis reports): {_ms_text(span['gpu_span_us'])}, busy "
                     f"{_ms_text(span['busy_us'])}, idle "
                     f"{_pct_text(span['idle_in_gpu_span_share'])}.")
    by_launch = accounting.get("by_launch")
    if by_launch:
        parts = [f"{_pct_text(by_launch['in_steps']['share_of_gpu_busy'] or 0.0)} of the GPU's "
                 "busy time was launched inside the profiler steps"]
        outside, unlaunched = by_launch["outside_steps"], by_launch["no_launch_event"]
        if outside["activity_count"]:
            parts.append(f"{_ms_text(outside['busy_us'])} "
                         f"({_pct_text(outside['share_of_gpu_busy'] or 0.0)}) by CPU work "
                         "outside every step")
        if unlaunched["activity_count"]:
            parts.append(f"{_ms_text(unlaunched['busy_us'])} "
                         f"({_pct_text(unlaunched['share_of_gpu_busy'] or 0.0)}) has no launch "
                         "event in the trace (launched before the profiler started)")
        words.append(f"By the step that launched it{whole}: " + "; ".join(parts) + ". A step's "
                     "'launched' figures count its work in full, however late the GPU ran it.")
    return words


def part_shares(accounting: dict) -> dict[str, float | None]:
    """{part: share of the window}: the stored "parts_share", or, for an accounting stored
    before it existed, the same rounding applied to "parts_us"."""
    if accounting.get("parts_share"):
        return accounting["parts_share"]
    window_us = accounting.get("window_us") or 0.0
    return {part: _share(us, window_us) for part, us in (accounting.get("parts_us") or {}).items()}


def time_accounting(trace: Any, step: int | None = None, cpu_evidence: dict | None = None
                    ) -> dict:
    """Where the window's time went. `trace`: a ParsedTrace, a path or a file object.
    `step`: one ProfilerStep#N only (ValueError naming the recorded steps if absent).
    `cpu_evidence`: a CPU run's summary["cpu_evidence"] (oneDNN primitives), optional.

    -> {"kind": "gpu" | "cpu", "window": {...}, "step_time_us", "window_us", "busy_us",
        "idle_us", "idle_share", "parts_us" (adds up to window_us), "parts_share" (of the
        window; "idle" equals idle_share), "parts_per_step_us",
        "steps" (per ProfilerStep table), ...}; GPU adds compute/communication/copy/overlap,
    "copies" (per direction) and "streams" tables; CPU adds "ops", "matrix_ops", "cast_us".
    """
    parsed = trace if isinstance(trace, ParsedTrace) else load_trace(trace)
    if parsed.is_gpu:
        return gpu_accounting(parsed, step)
    return cpu_accounting(parsed, step, cpu_evidence)
