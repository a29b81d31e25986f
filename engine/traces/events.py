"""What is kept of one profiler event: the categories read, a tuple per kind of event,
and the field checks that turn an event of the wrong shape into a counted defect instead of
a crash later. Both reading paths (engine.traces.reader's typed fast path and the plain
path's object hook, `compact_dict`) build these tuples; tests compare the two."""

from __future__ import annotations

import functools
import math
import re
from typing import Any

from engine.traces.op_flops import SHAPED_OPS

KERNEL_EVENT_CATEGORIES = frozenset({"kernel", "Kernel"})
# Copy-engine transfers and fills: a GPU activity of their own, not kernels (old schema:
# "Memcpy"/"Memset"). Kineto records bytes in args; the direction is in the name.
COPY_EVENT_CATEGORIES = frozenset({"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"})
LAUNCH_EVENT_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "Runtime"})
CPU_OP_EVENT_CATEGORIES = frozenset({"cpu_op", "Operator"})
# record_function spans on the CPU side: profiler steps, the DataLoader, the optimizer.
ANNOTATION_EVENT_CATEGORIES = frozenset({"user_annotation"})
# Traces that are not CUDA/ROCm kernel timelines say what they are through these: the CUPTI
# range profiler records one event per kernel with its SASS instruction counters (and no
# `kernel` events); other accelerators' runtimes and device events (Meta's MTIA, Intel's
# XPU) have their own categories. Counted, so a trace of them is never read as a CPU run.
RANGE_EVENT_CATEGORY = "cuda_profiler_range"
RANGE_COUNTERS = tuple(f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum"
                       for op in ("ffma", "fadd", "fmul", "hfma", "hadd", "hmul",
                                  "dfma", "dadd", "dmul"))
OTHER_DEVICE_PREFIXES = ("mtia_", "xpu_", "privateuse1", "hpu_", "tpu_")

KEPT_CATEGORIES = (KERNEL_EVENT_CATEGORIES | COPY_EVENT_CATEGORIES | LAUNCH_EVENT_CATEGORIES
                   | CPU_OP_EVENT_CATEGORIES | ANNOTATION_EVENT_CATEGORIES)
SPAN_PREFIXES = ("ProfilerStep#", "enumerate(DataLoader)", "Optimizer.step#",
                 "Optimizer.zero_grad#")



# ---------------------------------------------------------------------------------------
# what is kept of an event

class _Kernel(tuple):
    """(name, ts_us, dur_us, pid, tid, correlation, external_id, stream, device)"""


class _Launch(tuple):
    """(correlation, external_id, ts_us, pid, tid, name, dur_us)"""


class _CpuOp(tuple):
    """(name, ts_us, end_us, pid, tid, external_id)"""


class _ShapedOp(tuple):
    """(name, ts_us, end_us, pid, tid, external_id, input_dims, input_types,
    concrete_inputs) of a matrix op the trace recorded shapes for (record_shapes=True):
    the first six are its _CpuOp; the rest are the per-op FLOPs' inputs (engine.traces.
    op_flops). Kept only for the ops in SHAPED_OPS: shapes of every op would be most of a
    trace's text."""


class _CommKernel(tuple):
    """A collective's kernel with what NCCL/RCCL tell of it (Kineto copies them from
    record_param_comms): its _Kernel, then (collective, in_nelems, out_nelems, group_size,
    dtype); the message sizes give bus bandwidth (engine.traces.sets)."""


COLLECTIVE_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype")


def collective_fields(values: list) -> tuple | None:
    """(collective, in_nelems, out_nelems, group_size, dtype) when they have the shapes
    Kineto writes; None otherwise."""
    name, in_n, out_n, group, dtype = values
    if not isinstance(name, str) or not all(
            type(v) is int and 0 <= v < 1 << 48 for v in (in_n, out_n, group)):
        return None
    return name[:60], in_n, out_n, group, dtype[:20] if isinstance(dtype, str) else None


class _Range(tuple):
    """(name, ts_us, dur_us, counters) of a CUPTI range-profiler event: one kernel replayed
    under the counters, `counters` the RANGE_COUNTERS values in order (None: not recorded).
    Its duration includes the replays: a weight, not a kernel time."""


class _Copy(tuple):
    """(name, ts_us, dur_us, stream, device, bytes, kind, correlation) of a copy-engine
    event; kind is "memcpy" or "memset"; correlation pairs it with its runtime call."""


class _Span(tuple):
    """(name, ts_us, end_us, pid, tid) of a record_function span (ProfilerStep#N, ...)."""


class _BadDuration(tuple):
    """(kind, "negative" | "missing"): a GPU activity or CPU op whose duration or start
    is missing, not a number or negative: a defect of the trace, left out of every sum."""


class _Malformed(tuple):
    """A kernel / launch / CPU-op event whose fields have the wrong shape (a name that is
    not text, an id that is a list or an object): counted and left out of every sum."""


_SCALAR = (int, float, str, type(None))


def _scalars(*values: Any) -> bool:
    return all(isinstance(value, _SCALAR) and not isinstance(value, bool) for value in values)


# Past this a time is a defect, not a time: 1e17 us is ~3,000 years (a Kineto timestamp
# is us since the epoch, ~1.8e15 today). A 1e308 ts would make every window absurd.
MAX_TIME_US = 1e17


def _time(value: Any) -> float | None:
    """A timestamp or duration in us, kept fractional (Kineto writes ns precision as
    fractional us; rounding them shifts short kernels by up to 18 %); None when missing,
    not a number, not finite, or beyond MAX_TIME_US."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):  # OverflowError: a 400-digit integer
        return None
    return number if math.isfinite(number) and abs(number) <= MAX_TIME_US else None


def _number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return number if math.isfinite(number) else 0.0


@functools.lru_cache(maxsize=1024)
def _stream_of_tid(tid: str) -> str | None:
    match = re.search(r"\d+", tid)
    return match.group() if match else None


def _stream(stream: Any, tid: Any) -> int | None:
    """args.stream, else the old schema's tid "stream 7"."""
    if stream is None and isinstance(tid, str):
        stream = _stream_of_tid(tid)  # a trace has a handful of tids and 300k kernels
    try:
        return int(stream) if stream is not None else None
    except (TypeError, ValueError, OverflowError):  # OverflowError: "stream": Infinity
        return None


def _timed(kind: str, ts: Any, dur: Any) -> tuple[float, float] | _BadDuration:
    ts_us, dur_us = _time(ts), _time(dur)
    if ts_us is None or dur_us is None or dur_us < 0:
        return _BadDuration((kind, "negative" if dur_us is not None and dur_us < 0
                             else "missing"))
    return ts_us, dur_us


def compact(category: str, name: Any, ts: Any, dur: Any, pid: Any, tid: Any,
            correlation: Any, external: Any, device: Any, stream: Any, size: Any) -> Any:
    """The tuple kept of one event of a kept category (None: not one the analysis reads).
    An event of ours with fields of the wrong shape becomes a _Malformed marker, one with
    a bad time a _BadDuration, instead of a crash later."""
    if category in KERNEL_EVENT_CATEGORIES:
        name = name or ""
        if not isinstance(name, str) or not _scalars(pid, tid, correlation, external, device):
            return _Malformed(("kernel",))
        timed = _timed("kernel", ts, dur)
        if type(timed) is _BadDuration:
            return timed
        return _Kernel((name, timed[0], timed[1], pid, tid, correlation, external,
                        _stream(stream, tid), device))
    if category in COPY_EVENT_CATEGORIES:
        name = name or ""
        if not isinstance(name, str) or not _scalars(pid, tid, device, size):
            return _Malformed(("copy",))
        timed = _timed("copy", ts, dur)
        if type(timed) is _BadDuration:
            return timed
        kind = "memset" if "memset" in category.lower() else "memcpy"
        size = _time(size)
        return _Copy((name, timed[0], timed[1], _stream(stream, tid), device,
                      int(size) if size is not None and size >= 0 else None, kind,
                      correlation if _scalars(correlation) else None))
    if category in ANNOTATION_EVENT_CATEGORIES:
        if not isinstance(name, str) or not name.startswith(SPAN_PREFIXES):
            return None
        timed = _timed("annotation", ts, dur)
        if type(timed) is _BadDuration:
            return timed
        return _Span((name, timed[0], timed[0] + timed[1], pid, tid))
    if category in LAUNCH_EVENT_CATEGORIES:
        if not _scalars(correlation, external, pid, tid):
            return _Malformed(("launch",))
        dur_us = _time(dur)
        return _Launch((correlation, external, _number(ts), pid, tid,
                        name if isinstance(name, str) else "",
                        dur_us if dur_us is not None and dur_us >= 0 else 0.0))
    if category in CPU_OP_EVENT_CATEGORIES:
        name = name or ""
        if not isinstance(name, str) or not _scalars(external, pid, tid):
            return _Malformed(("cpu op",))
        timed = _timed("cpu op", ts, dur)
        if type(timed) is _BadDuration:
            return timed
        return _CpuOp((name, timed[0], timed[0] + timed[1], pid, tid, external))
    return None


def _shapes(dims: Any, types: Any, concrete: Any) -> tuple | None:
    """(input_dims, input_types, concrete_inputs) as tuples when they have the shapes
    Kineto writes (a list of int lists, a list of type names, a list of strings); None
    otherwise: an op with odd shapes gets no FLOPs, not a crash."""
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) > 64:
        return None
    shaped = []
    for dim in dims:
        if not isinstance(dim, list) or len(dim) > 16 or not all(
                type(size) is int and 0 <= size < 1 << 48 for size in dim):
            return None
        shaped.append(tuple(dim))
    if not all(isinstance(name, str) and len(name) < 200 for name in types):
        return None
    concrete = tuple(value[:200] if isinstance(value, str) else ""
                     for value in concrete[:64]) if isinstance(concrete, list) else ()
    return tuple(shaped), tuple(types), concrete


def _shaped(op: "_CpuOp", dims: Any, types: Any, concrete: Any) -> "_CpuOp | _ShapedOp":
    shapes = _shapes(dims, types, concrete)
    return op if shapes is None else _ShapedOp(op + shapes)


def _arg(args: dict, *keys: str) -> Any:
    for key in keys:
        if key in args:
            return args[key]
    return None


class _Foreign(tuple):
    """(category,) of an event of another kind of device (see OTHER_DEVICE_PREFIXES)."""


def _range_counters(values: list) -> tuple:
    return tuple(value if type(value) in (int, float) and value >= 0 else None
                 for value in values)


def _foreign(category: str, obj: dict) -> Any:
    if category != RANGE_EVENT_CATEGORY:
        return _Foreign((category,))
    args = obj.get("args")
    args = args if isinstance(args, dict) else {}
    name, ts, dur = obj.get("name"), _time(obj.get("ts")), _time(obj.get("dur"))
    if not isinstance(name, str) or ts is None or dur is None or dur < 0:
        return _Malformed(("range",))
    return _Range((name, ts, dur, _range_counters([args.get(key) for key in RANGE_COUNTERS])))


def compact_dict(obj: dict) -> Any:
    """json object_hook for the plain path: an event -> its kept tuple (or None), any other
    object (an args dict, a deviceProperties entry, the top level) unchanged."""
    if "ph" not in obj and "cat" not in obj:
        return obj
    category = obj.get("cat")
    if not isinstance(category, str) or category not in KEPT_CATEGORIES:
        if isinstance(category, str) and (category == RANGE_EVENT_CATEGORY
                                          or category.startswith(OTHER_DEVICE_PREFIXES)):
            return _foreign(category, obj)
        return None
    args = obj.get("args")
    args = args if isinstance(args, dict) else {}
    kept = compact(category, obj.get("name"), obj.get("ts"), obj.get("dur"), obj.get("pid"),
                   obj.get("tid"), _arg(args, "correlation"),
                   _arg(args, "External id", "external id"), _arg(args, "device"),
                   args.get("stream"), args.get("bytes"))
    if type(kept) is _CpuOp and kept[0] in SHAPED_OPS:
        return _shaped(kept, args.get("Input Dims"), args.get("Input type"),
                       args.get("Concrete Inputs"))
    if type(kept) is _Kernel and "Collective name" in args:
        fields = collective_fields([args.get(key) for key in COLLECTIVE_ARGS])
        if fields is not None:
            return _CommKernel(kept + fields)
    return kept
