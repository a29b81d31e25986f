"""Profiler trace file -> kernel table -> breakdown: did the matrix work run on Tensor Cores?

Input: a PyTorch profiler (Kineto) Chrome trace, `.json` or `.json.gz`. Kernel events have
`cat` "kernel" (old traces: "Kernel"), `dur` in microseconds and `args.correlation`, which
links each kernel to the CUDA runtime/driver call that launched it; that call carries the
`External id` of the CPU op (aten::mm, ...) it ran under.

Times are sums of kernel durations (`*_us`), not wall time: kernels on different streams
overlap, and a share of summed kernel time is what says where the GPU's work went.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import zlib
from collections import defaultdict
from typing import IO, Any

import pandas as pd

from engine.analysis.kernels import KERNEL_CATEGORIES, MATRIX_CATEGORIES, classify_kernel
from engine.hardware.gpus import compute_capability_from_name

KERNEL_EVENT_CATEGORIES = frozenset({"kernel", "Kernel"})
LAUNCH_EVENT_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "Runtime"})
CPU_OP_EVENT_CATEGORIES = frozenset({"cpu_op", "Operator"})

TABLE_COLUMNS = ("name", "dur_us", "ts_us", "stream", "device", "correlation", "external_id",
                 "cpu_op", "category", "tensor_core", "dtype", "reason")
UNATTRIBUTED_OP = "(unattributed)"
TOP_KERNELS = 20
TOP_OPS_WITHOUT_TC = 20
YES_SHARE = 0.8  # matrix time on Tensor Cores at or above which the verdict is a plain "yes"

_GZIP_MAGIC = b"\x1f\x8b"


# ---------------------------------------------------------------------------------------
# reading

class _Kernel(tuple):
    """(name, ts_us, dur_us, pid, tid, correlation, external_id, stream, device)"""


class _Launch(tuple):
    """(correlation, external_id, ts_us, pid, tid)"""


class _CpuOp(tuple):
    """(name, ts_us, end_us, pid, tid, external_id)"""


def _arg(args: dict, *keys: str) -> Any:
    for key in keys:
        if key in args:
            return args[key]
    return None


def _args(obj: dict) -> dict:
    args = obj.get("args")
    return args if isinstance(args, dict) else {}


class _Malformed(tuple):
    """A kernel / launch / CPU-op event whose fields have the wrong shape (a name that is
    not text, an id that is a list or an object): counted and left out of every sum."""


_SCALAR = (int, float, str, type(None))


def _scalars(*values: Any) -> bool:
    return all(isinstance(value, _SCALAR) and not isinstance(value, bool) for value in values)


def _compact_event(obj: dict) -> Any:
    """json object_hook: keep the few fields we use of kernel / launch / CPU-op events and
    drop every other event as soon as it is parsed, so memory stays bounded on big traces
    (python_function and flow events are most of a Kineto file). An event of ours with
    fields of the wrong shape becomes a _Malformed marker instead of a crash later."""
    if "ph" not in obj and "cat" not in obj:
        return obj  # an args dict, a deviceProperties entry, or the top-level object
    category = obj.get("cat")
    if not isinstance(category, str):
        return None
    if category in KERNEL_EVENT_CATEGORIES:
        args = _args(obj)
        name, correlation = obj.get("name") or "", _arg(args, "correlation")
        external, device = _arg(args, "External id", "external id"), _arg(args, "device")
        if not isinstance(name, str) or not _scalars(obj.get("pid"), obj.get("tid"), correlation,
                                                     external, device):
            return _Malformed(("kernel",))
        return _Kernel((name, _number(obj.get("ts")), _number(obj.get("dur")),
                        obj.get("pid"), obj.get("tid"), correlation, external,
                        _stream(args, obj.get("tid")), device))
    if category in LAUNCH_EVENT_CATEGORIES:
        args = _args(obj)
        correlation, external = _arg(args, "correlation"), _arg(args, "External id", "external id")
        if not _scalars(correlation, external, obj.get("pid"), obj.get("tid")):
            return _Malformed(("launch",))
        return _Launch((correlation, external, _number(obj.get("ts")), obj.get("pid"),
                        obj.get("tid")))
    if category in CPU_OP_EVENT_CATEGORIES:
        args = _args(obj)
        name, external = obj.get("name") or "", _arg(args, "External id", "external id")
        if not isinstance(name, str) or not _scalars(external, obj.get("pid"), obj.get("tid")):
            return _Malformed(("cpu op",))
        ts_us = _number(obj.get("ts"))
        return _CpuOp((name, ts_us, ts_us + _number(obj.get("dur")),
                       obj.get("pid"), obj.get("tid"), external))
    return None


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _stream(args: dict, tid: Any) -> int | None:
    """args.stream, else the old schema's tid "stream 7"."""
    stream = args.get("stream")
    if stream is None and isinstance(tid, str):
        match = re.search(r"\d+", tid)
        stream = match.group() if match else None
    try:
        return int(stream) if stream is not None else None
    except (TypeError, ValueError):
        return None


def _source_name(path_or_fileobj: Any) -> str:
    if isinstance(path_or_fileobj, (str, os.PathLike)):
        return os.fspath(path_or_fileobj)
    return str(getattr(path_or_fileobj, "name", "<trace stream>"))


MAX_TRACE_ENV = "PRECISION_LAB_MAX_TRACE_MIB"
# Decompressed bytes a trace may have: real profiler windows are tens of MiB (the largest
# fixture, 190 MiB, parses in ~1.4 GiB of memory); a gzip bomb stops here instead of
# taking the server's memory. Raise it with PRECISION_LAB_MAX_TRACE_MIB.
DEFAULT_MAX_TRACE_MIB = 200
_CHUNK = 1 << 20


class TraceTooLarge(ValueError):
    """The trace (decompressed) is larger than the configured limit."""


def max_trace_bytes() -> int:
    text = os.environ.get(MAX_TRACE_ENV, "")
    try:
        mib = int(text) if text.strip() else DEFAULT_MAX_TRACE_MIB
    except ValueError:
        mib = DEFAULT_MAX_TRACE_MIB
    return max(1, mib) * 2**20


def _too_large(source: str, limit: int) -> TraceTooLarge:
    return TraceTooLarge(f"{source}: larger than {limit // 2**20} MiB decompressed, the limit "
                         f"for a trace; set {MAX_TRACE_ENV} to raise it")


def _read_bytes(path_or_fileobj: str | os.PathLike | IO[bytes], source: str = "trace") -> bytes:
    """The (decompressed) file content, read in chunks and refused past the size limit.
    gzip is detected by its magic bytes, not the name."""
    limit = max_trace_bytes()
    if isinstance(path_or_fileobj, (str, os.PathLike)):
        with open(path_or_fileobj, "rb") as handle:
            return _read_limited(handle, limit, source)
    return _read_limited(path_or_fileobj, limit, source)


def _read_limited(handle: IO[bytes], limit: int, source: str) -> bytes:
    head = handle.read(2)
    if isinstance(head, str):  # a text stream
        head = head.encode()
        rest = handle.read().encode()
        raw = head + rest
        if len(raw) > limit:
            raise _too_large(source, limit)
        return raw
    stream = gzip.GzipFile(fileobj=_Prefixed(head, handle)) if head == _GZIP_MAGIC else None
    parts, total = [head] if stream is None else [], 0 if stream is not None else len(head)
    reader = stream or handle
    while True:
        chunk = reader.read(_CHUNK)
        if not chunk:
            break
        total += len(chunk)
        if total > limit:  # stop reading: a bomb never expands past the limit in memory
            raise _too_large(source, limit)
        parts.append(chunk)
    return b"".join(parts)


class _Prefixed(io.RawIOBase):
    """`head` followed by the rest of `handle`: the gzip reader after the magic sniff."""

    def __init__(self, head: bytes, handle: IO[bytes]):
        self._head, self._handle = head, handle

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n], self._head = self._head[:n], self._head[n:]
            return n
        data = self._handle.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _parse_trace(path_or_fileobj: Any) -> tuple[list, list[dict]]:
    """-> (compact events, deviceProperties). ValueError naming the source if it is not a
    Chrome trace with events."""
    source = _source_name(path_or_fileobj)
    try:
        raw = _read_bytes(path_or_fileobj, source)
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:  # missing, unreadable, corrupt gzip
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ValueError(f"{source}: cannot read trace file: {reason}") from exc
    try:
        data = json.loads(raw, object_hook=_compact_event)
    except RecursionError:
        raise ValueError(f"{source}: JSON nested too deeply to be a profiler trace") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{source}: not a JSON trace file ({exc})") from exc
    del raw
    if isinstance(data, list):  # Chrome "JSON array" format: the file is the event list
        if not all(event is None or isinstance(event, (tuple, dict)) for event in data):
            raise ValueError(f"{source}: a JSON list that is not a list of trace events "
                             "(objects with 'ph'/'cat'), so not a profiler trace")
        return data, []
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        keys = ", ".join(sorted(data)[:8]) if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{source}: no 'traceEvents' list, so not a PyTorch profiler "
                         f"(Chrome trace) file; found: {keys or 'nothing'}. Export one with "
                         "torch.profiler's on_trace_ready=tensorboard_trace_handler or "
                         "prof.export_chrome_trace(path).")
    properties = data.get("deviceProperties")
    return data["traceEvents"], properties if isinstance(properties, list) else []


# ---------------------------------------------------------------------------------------
# kernel -> launching CPU op

def _innermost_ops(ops: list[_CpuOp], times_us: list[float]) -> list[str | None]:
    """For sorted query times on one thread, the innermost CPU op open at each time.

    One sweep with a stack of open ops (ops nest on a thread): O(n log n), where a search
    per kernel would be quadratic on long traces.
    """
    ops = sorted(ops, key=lambda op: (op[1], -op[2]))  # parents before same-start children
    names: list[str | None] = []
    stack: list[_CpuOp] = []
    next_op = 0
    for time_us in times_us:
        while next_op < len(ops) and ops[next_op][1] <= time_us:
            op = ops[next_op]
            while stack and stack[-1][2] < op[1]:
                stack.pop()
            stack.append(op)
            next_op += 1
        while stack and stack[-1][2] < time_us:
            stack.pop()
        names.append(stack[-1][0] if stack else None)
    return names


def _attribute_kernels(kernels: list[_Kernel], launches: dict, ops: list[_CpuOp]
                       ) -> tuple[list[Any], list[str | None]]:
    """-> (external_id, cpu_op) per kernel.

    First choice: kernel (or its launch) External id -> the CPU op with that id, if that op
    really encloses the launch in time. Some tools rewrite External ids (HTA's sampled test
    traces set them to the correlation id), so when the id finds nothing or the wrong op,
    fall back to the innermost CPU op open on the launching thread at launch time. Kernels
    launched before the profiling window have no launch event and stay unattributed.
    """
    ops_by_id: dict[Any, _CpuOp] = {}
    ops_by_thread: dict[tuple, list[_CpuOp]] = defaultdict(list)
    for op in ops:
        known = ops_by_id.get(op[5])
        if op[5] is not None and (known is None or op[2] - op[1] < known[2] - known[1]):
            ops_by_id[op[5]] = op
        ops_by_thread[(op[3], op[4])].append(op)

    external_ids: list[Any] = []
    cpu_ops: list[str | None] = [None] * len(kernels)
    needs_sweep: dict[tuple, list[tuple[float, int]]] = defaultdict(list)
    for index, kernel in enumerate(kernels):
        launch = launches.get(kernel[5]) if kernel[5] is not None else None
        external_id = kernel[6] if kernel[6] is not None else (launch[1] if launch else None)
        external_ids.append(external_id)
        op = ops_by_id.get(external_id) if external_id is not None else None
        if op is not None and (launch is None or _encloses(op, launch)):
            cpu_ops[index] = op[0]
        elif launch is not None:
            needs_sweep[(launch[3], launch[4])].append((launch[2], index))

    for thread, queries in needs_sweep.items():
        queries.sort()
        names = _innermost_ops(ops_by_thread.get(thread, []), [q[0] for q in queries])
        for (_, index), name in zip(queries, names):
            cpu_ops[index] = name
    return external_ids, cpu_ops


def _encloses(op: _CpuOp, launch: _Launch) -> bool:
    return op[3] == launch[3] and op[4] == launch[4] and op[1] <= launch[2] <= op[2]


# ---------------------------------------------------------------------------------------
# device

def _device_from_properties(properties: list[dict], kernels: list[_Kernel]
                            ) -> tuple[str | None, str | None]:
    """-> (name, compute capability) of the GPU the kernels ran on (most kernels' device)."""
    counts: dict[Any, int] = defaultdict(int)
    for kernel in kernels:
        counts[kernel[8]] += 1
    device_index = max(counts, key=counts.get) if counts else None
    chosen = None
    for entry in properties:
        if isinstance(entry, dict) and entry.get("id") == device_index:
            chosen = entry
            break
    if chosen is None and properties and isinstance(properties[0], dict):
        chosen = properties[0]
    if chosen is None:
        return None, None
    name = chosen.get("name") if isinstance(chosen.get("name"), str) else None
    major, minor = chosen.get("computeMajor"), chosen.get("computeMinor")
    if not (isinstance(major, int) and isinstance(minor, int)):  # crafted or missing
        major = minor = None
    capability = f"{major}.{minor}" if major is not None and minor is not None else None
    return name, capability or compute_capability_from_name(name)


# ---------------------------------------------------------------------------------------
# public: table

def _empty_table() -> pd.DataFrame:
    return pd.DataFrame({column: pd.Series(dtype="object") for column in TABLE_COLUMNS}).astype(
        {"dur_us": "float64", "ts_us": "float64"})


def load_kernel_table(path_or_fileobj: str | os.PathLike | IO[bytes]) -> pd.DataFrame:
    """One row per GPU kernel event, classified. Columns: TABLE_COLUMNS.

    `table.attrs` carries source, device (name), compute_capability. Raises ValueError
    naming the file when it cannot be read or is not a profiler trace.
    """
    events, properties = _parse_trace(path_or_fileobj)
    kernels: list[_Kernel] = []
    launches: dict[Any, _Launch] = {}
    ops: list[_CpuOp] = []
    malformed = 0
    for event in events:
        kind = type(event)
        if kind is _Kernel:
            kernels.append(event)
        elif kind is _Launch and event[0] is not None:
            launches[event[0]] = event
        elif kind is _CpuOp:
            ops.append(event)
        elif kind is _Malformed:
            malformed += 1
    del events
    device, capability = _device_from_properties(
        [entry for entry in properties if isinstance(entry, dict)], kernels)
    table = _build_table(kernels, launches, ops)
    table.attrs.update(source=_source_name(path_or_fileobj), device=device,
                       compute_capability=capability, malformed_events=malformed)
    return table


def _build_table(kernels: list[_Kernel], launches: dict, ops: list[_CpuOp]) -> pd.DataFrame:
    if not kernels:
        return _empty_table()
    external_ids, cpu_ops = _attribute_kernels(kernels, launches, ops)
    table = pd.DataFrame({
        "name": [k[0] for k in kernels],
        "dur_us": pd.Series([k[2] for k in kernels], dtype="float64"),
        "ts_us": pd.Series([k[1] for k in kernels], dtype="float64"),
        "stream": pd.array([k[7] for k in kernels], dtype="Int64"),
        "device": pd.array([_int_or_none(k[8]) for k in kernels], dtype="Int64"),
        "correlation": pd.array([_int_or_none(k[5]) for k in kernels], dtype="Int64"),
        "external_id": pd.array([_int_or_none(x) for x in external_ids], dtype="Int64"),
        "cpu_op": pd.Series(cpu_ops, dtype="object"),
    })
    verdicts = {name: classify_kernel(name) for name in table["name"].unique()}
    for field in ("category", "tensor_core", "dtype", "reason"):
        table[field] = table["name"].map({n: getattr(v, field) for n, v in verdicts.items()})
    return table.sort_values("ts_us", kind="stable").reset_index(drop=True)


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def trace_metadata(path_or_fileobj: str | os.PathLike | IO[bytes]) -> dict:
    """{"source", "device", "compute_capability", "kernel_count"} of a trace file."""
    table = load_kernel_table(path_or_fileobj)
    return {**table.attrs, "kernel_count": int(len(table))}


def trace_device(path_or_fileobj: str | os.PathLike | IO[bytes]) -> str | None:
    """Name of the GPU the trace's kernels ran on (deviceProperties), or None."""
    return trace_metadata(path_or_fileobj)["device"]


# ---------------------------------------------------------------------------------------
# public: breakdown

def _us(value: float) -> float:
    return round(float(value), 3)


def _share(part: float, whole: float) -> float | None:
    return round(float(part) / float(whole), 4) if whole > 0 else None


def _short_kernel_name(name: str, limit: int = 60) -> str:
    """`void ns::kernel<...>(...)` -> `ns::kernel`: enough to recognise it in a headline."""
    short = re.sub(r"^void\s+", "", name)
    short = re.split(r"[<(]", short, maxsplit=1)[0] or name
    return short if len(short) <= limit else short[:limit - 3] + "..."


def _capability_number(capability: str | None) -> float | None:
    try:
        return float(capability) if capability else None
    except ValueError:
        return None


def breakdown(table: pd.DataFrame, device: str | None = None) -> dict:
    """JSON-serialisable summary of a kernel table: totals, Tensor-Core shares, categories,
    top kernels, per-op attribution, ops that could have used Tensor Cores, and a verdict."""
    device = device or table.attrs.get("device")
    capability = table.attrs.get("compute_capability") or compute_capability_from_name(device)
    if device and device != table.attrs.get("device"):
        capability = compute_capability_from_name(device) or capability
    dur = table["dur_us"].astype("float64")
    on_tc = table["tensor_core"] == "yes"
    is_matrix = table["category"].isin(MATRIX_CATEGORIES)
    total_us, tc_us = float(dur.sum()), float(dur[on_tc].sum())
    matrix_us, matrix_tc_us = float(dur[is_matrix].sum()), float(dur[is_matrix & on_tc].sum())
    categories = table.groupby("category")["dur_us"].sum()
    result = {
        "device": device,
        "compute_capability": capability,
        "kernel_count": int(len(table)),
        "total_kernel_us": _us(total_us),
        "tensor_core_us": _us(tc_us),
        "tensor_core_share": _share(tc_us, total_us),
        "unknown_us": _us(dur[table["tensor_core"] == "unknown"].sum()),
        "matrix_us": _us(matrix_us),
        "matrix_tensor_core_us": _us(matrix_tc_us),
        "matrix_tensor_core_share": _share(matrix_tc_us, matrix_us),
        "categories": {c: _us(categories.get(c, 0.0)) for c in KERNEL_CATEGORIES},
        "tensor_core_dtypes": _tensor_core_dtypes(table[on_tc]),
        "top_kernels": top_kernels(table),
        "per_op": per_op(table),
    }
    result["could_have_didnt"] = could_have_didnt(table, device, capability)
    result["verdict"] = _verdict(table, result, device, capability)
    return result


def _tensor_core_dtypes(tc_rows: pd.DataFrame) -> dict[str, float]:
    """{dtype: us} of Tensor Core kernels, largest first."""
    by_dtype = tc_rows.groupby(tc_rows["dtype"].fillna("unknown"))["dur_us"].sum()
    return {str(k): _us(v) for k, v in by_dtype.sort_values(ascending=False).items()}


def top_kernels(table: pd.DataFrame, limit: int = TOP_KERNELS) -> list[dict]:
    """Kernels by summed time, largest first: name, total_us, count, verdict fields."""
    if table.empty:
        return []
    grouped = (table.groupby("name", sort=False)
               .agg(total_us=("dur_us", "sum"), count=("dur_us", "size"),
                    tensor_core=("tensor_core", "first"), dtype=("dtype", "first"),
                    reason=("reason", "first"), category=("category", "first"))
               .sort_values("total_us", ascending=False, kind="stable").head(limit))
    return [{"name": name, "total_us": _us(row["total_us"]), "count": int(row["count"]),
             "tensor_core": row["tensor_core"], "dtype": _none_if_na(row["dtype"]),
             "reason": row["reason"], "category": row["category"]}
            for name, row in grouped.iterrows()]


def _none_if_na(value: Any) -> Any:
    return None if value is None or (isinstance(value, float) and pd.isna(value)) else value


def _op_frame(table: pd.DataFrame) -> pd.DataFrame:
    """Per-kernel columns needed for per-op sums; unattributed kernels get a visible name."""
    dur = table["dur_us"].astype("float64")
    on_tc = table["tensor_core"] == "yes"
    is_matrix = table["category"].isin(MATRIX_CATEGORIES)
    return pd.DataFrame({
        "cpu_op": table["cpu_op"].fillna(UNATTRIBUTED_OP),
        "kernel_us": dur,
        "tensor_core_us": dur.where(on_tc, 0.0),
        "matrix_us": dur.where(is_matrix, 0.0),
        "matrix_no_tc_us": dur.where(is_matrix & (table["tensor_core"] == "no"), 0.0),
    })


def per_op(table: pd.DataFrame) -> list[dict]:
    """Kernel time per launching CPU op, largest first."""
    if table.empty:
        return []
    sums = _op_frame(table).groupby("cpu_op").agg(
        kernel_us=("kernel_us", "sum"), tensor_core_us=("tensor_core_us", "sum"),
        matrix_us=("matrix_us", "sum"), kernel_count=("kernel_us", "size"))
    sums = sums.sort_values("kernel_us", ascending=False, kind="stable")
    return [{"cpu_op": op, "kernel_us": _us(row["kernel_us"]),
             "tensor_core_us": _us(row["tensor_core_us"]),
             "tensor_core_share": _share(row["tensor_core_us"], row["kernel_us"]),
             "matrix_us": _us(row["matrix_us"]), "kernel_count": int(row["kernel_count"])}
            for op, row in sums.iterrows()]


# ---------------------------------------------------------------------------------------
# ops whose matrix kernels ran without Tensor Cores, and why

CAUSE_NO_HARDWARE = "no Tensor Core hardware on this GPU"
CAUSE_FP32_NO_TF32 = "fp32 without TF32 (enable tf32 or autocast)"
CAUSE_FP32_IN_AMP = "op ran in fp32: outside autocast or kept in fp32 by autocast"
CAUSE_FP32_PRE_AMPERE = ("fp32 on a Volta/Turing GPU: its Tensor Cores take fp16 only "
                         "(use fp16 autocast; TF32 needs Ampere)")
CAUSE_SMALL_SHAPES = ("dimensions too small / not multiples of 8 (Tensor Cores need multiples "
                      "of 8 for fp16/bf16)")
CAUSE_BF16_EMULATED = "bf16 on a GPU without bf16 Tensor Cores (Volta/Turing emulate bf16)"
CAUSE_LOW_PRECISION_NO_TC = ("fp16/bf16 kernel without a Tensor Core path: check shapes "
                             "(multiples of 8), alignment and the kernel build")
CAUSE_FP64 = "fp64 math: only A100/H100-class GPUs have fp64 Tensor Cores"
CAUSE_COMPLEX = ("complex GEMM / FFT path (e.g. cuDNN FFT convolution in fp32): no Tensor "
                 "Core kernel was chosen")
CAUSE_OTHER = "kernel without a Tensor Core path: check dtype (fp16/bf16/tf32) and shapes"

_PRE_VOLTA_KERNELS = re.compile(r"^(?:cudnn_)?(?:infer_|train_)?(?:maxwell|pascal|kepler)_")
# Kernels built only for sm70+ (SASS names carry the build target): if one ran, so did a GPU
# with Tensor Cores. maxwell_ builds alone do not prove the opposite (cuDNN runs some on
# Volta), which is why that evidence is used only when nothing newer ran.
_VOLTA_OR_NEWER_KERNELS = re.compile(
    r"^(?:cudnn_)?(?:infer_|train_)?(?:volta|turing|ampere|hopper|blackwell)_"
    r"|(?:^|_)sm(?:7|8|9|1\d)\d_xmma|^nvjet_|cutlass_(?:7|8|9)\d_")
_SMALL_SHAPE_KERNELS = re.compile(r"gemv|gemmsn|gemmk1|dot_kernel", re.IGNORECASE)


def _has_tensor_core_hardware(capability: float | None, table: pd.DataFrame) -> bool | None:
    """True/False from the compute capability; without one, from which kernel builds ran;
    None when nothing says."""
    if capability is not None:
        return capability >= 7.0
    names = table["name"]
    if (table["tensor_core"] == "yes").any() or names.str.contains(_VOLTA_OR_NEWER_KERNELS).any():
        return True
    if names.str.contains(_PRE_VOLTA_KERNELS).any():
        return False
    return None


def _mixed_precision_run(table: pd.DataFrame) -> bool:
    """fp16/bf16/fp8 kernels anywhere: the run used autocast or low-precision tensors."""
    return bool(table["dtype"].isin(("fp16", "bf16", "fp8", "fp4")).any())


def _likely_causes(kernels: pd.DataFrame, capability: float | None, has_hardware: bool | None,
                   mixed_precision: bool, device: str | None) -> list[str]:
    """Why these non-Tensor-Core matrix kernels (one op's) did not use Tensor Cores."""
    if has_hardware is False:
        where = f" ({device})" if device else (
            " (judged from the Maxwell/Pascal kernel builds; the trace names no GPU)")
        return [f"{CAUSE_NO_HARDWARE}{where}: Tensor Cores start with Volta (sm70)"]
    causes: list[str] = []
    dtypes = set(kernels["dtype"].dropna())
    if "fp32" in dtypes:
        if mixed_precision:
            causes.append(CAUSE_FP32_IN_AMP)
        if capability is not None and capability < 8.0:
            causes.append(CAUSE_FP32_PRE_AMPERE)
        elif not mixed_precision:
            causes.append(CAUSE_FP32_NO_TF32)
    if kernels["name"].str.contains(_SMALL_SHAPE_KERNELS).any():
        causes.append(CAUSE_SMALL_SHAPES)
    if "bf16" in dtypes and capability is not None and capability < 8.0:
        causes.append(CAUSE_BF16_EMULATED)
    elif dtypes & {"fp16", "bf16"} and CAUSE_SMALL_SHAPES not in causes:
        causes.append(CAUSE_LOW_PRECISION_NO_TC)
    if "fp64" in dtypes:
        causes.append(CAUSE_FP64)
    if "complex64" in dtypes:
        causes.append(CAUSE_COMPLEX)
    return causes or [CAUSE_OTHER]


def could_have_didnt(table: pd.DataFrame, device: str | None = None,
                     capability: str | None = None, limit: int = TOP_OPS_WITHOUT_TC
                     ) -> list[dict]:
    """CPU ops whose matrix kernels (gemm/conv/attention) ran without Tensor Cores, largest
    first, each with the kernels as evidence and likely causes."""
    if table.empty:
        return []
    capability_number = _capability_number(capability)
    has_hardware = _has_tensor_core_hardware(capability_number, table)
    mixed_precision = _mixed_precision_run(table)
    ops = _op_frame(table)
    no_tc = table[ops["matrix_no_tc_us"] > 0]
    if no_tc.empty:
        return []
    totals = ops.groupby("cpu_op")[["matrix_us", "matrix_no_tc_us"]].sum()
    entries = []
    for op, kernels in no_tc.groupby(ops["cpu_op"][no_tc.index]):
        by_name = kernels.groupby("name")["dur_us"].sum().sort_values(ascending=False)
        matrix_us, no_tc_us = totals.loc[op, "matrix_us"], totals.loc[op, "matrix_no_tc_us"]
        entries.append({
            "cpu_op": op,
            "matrix_us": _us(matrix_us),
            "without_tensor_core_us": _us(no_tc_us),
            "without_tensor_core_share": _share(no_tc_us, matrix_us),
            "dtypes": sorted(set(kernels["dtype"].dropna())),
            "kernels": list(by_name.index[:3]),
            "likely_causes": _likely_causes(kernels, capability_number, has_hardware,
                                            mixed_precision, device),
        })
    entries.sort(key=lambda e: e["without_tensor_core_us"], reverse=True)
    return entries[:limit]


# ---------------------------------------------------------------------------------------
# verdict

def _top_names(rows: pd.DataFrame, count: int = 3) -> list[str]:
    return list(rows.groupby("name")["dur_us"].sum().sort_values(ascending=False)
                .index[:count])


def _dtype_words(rows: pd.DataFrame) -> str:
    """"bf16" or "tf32/fp32": dtypes by time, largest first."""
    by_dtype = rows.groupby(rows["dtype"].fillna("unknown-dtype"))["dur_us"].sum()
    return "/".join(by_dtype.sort_values(ascending=False).index[:2])


def _verdict(table: pd.DataFrame, summary: dict, device: str | None,
             capability: str | None) -> dict:
    if table.empty:
        return {"tensor_cores": "unknown", "evidence": [],
                "headline": "No GPU kernels in this trace: a CPU-only run, or the profiler "
                            "(CUPTI) recorded no GPU activity"}
    matrix = table[table["category"].isin(MATRIX_CATEGORIES)]
    if matrix.empty:
        return {"tensor_cores": "unknown", "evidence": [],
                "headline": "Tensor Cores: unknown, no GEMM/conv/attention kernels in this trace"}
    matrix_us = float(matrix["dur_us"].sum())
    yes_rows = matrix[matrix["tensor_core"] == "yes"]
    no_rows = matrix[matrix["tensor_core"] == "no"]
    unknown_rows = matrix[matrix["tensor_core"] == "unknown"]
    yes_share = float(yes_rows["dur_us"].sum()) / matrix_us
    no_share = float(no_rows["dur_us"].sum()) / matrix_us
    unknown_share = float(unknown_rows["dur_us"].sum()) / matrix_us
    if unknown_share > yes_share + no_share:
        return {"tensor_cores": "unknown", "evidence": _top_names(unknown_rows),
                "headline": f"Tensor Cores: unknown, {_pct(unknown_share)} of matrix time is in "
                            "kernels whose names do not say (e.g. Triton)"}
    if yes_share >= YES_SHARE:
        return {"tensor_cores": "yes", "evidence": _top_names(yes_rows),
                "headline": f"Tensor Cores: yes, {_pct(yes_share)} of matrix time in "
                            f"{_dtype_words(yes_rows)} tensor-core kernels"}
    on_cuda_cores = ""
    if not no_rows.empty:
        example = _short_kernel_name(_top_names(no_rows, 1)[0])
        on_cuda_cores = f"on CUDA cores ({_dtype_words(no_rows)}, e.g. {example})"
    if yes_share > 0:
        rest = (f"{_pct(no_share)} {on_cuda_cores}" if not no_rows.empty else
                f"{_pct(unknown_share)} in kernels whose names do not say")
        return {"tensor_cores": "partly",
                "evidence": _top_names(yes_rows, 2) + _top_names(no_rows, 2),
                "headline": f"Tensor Cores: partly, {_pct(yes_share)} of matrix time in "
                            f"{_dtype_words(yes_rows)} tensor-core kernels; {rest}"}
    hardware = _has_tensor_core_hardware(_capability_number(capability), table)
    why = f"; {device or 'this GPU'} has no Tensor Cores" if hardware is False else ""
    return {"tensor_cores": "no", "evidence": _top_names(no_rows),
            "headline": f"Tensor Cores: no, {_pct(no_share)} of matrix time {on_cuda_cores}{why}"}


def _pct(share: float) -> str:
    return f"{share * 100:.0f} %"


# ---------------------------------------------------------------------------------------

def analyze_trace(path_or_fileobj: str | os.PathLike | IO[bytes]) -> dict:
    """load_kernel_table + breakdown, plus the source: what `python -m engine kernels` prints."""
    table = load_kernel_table(path_or_fileobj)
    result = {"source": table.attrs.get("source"), **breakdown(table)}
    result["malformed_events"] = table.attrs.get("malformed_events", 0)
    return result


def kernel_summary_rows(table: pd.DataFrame) -> list[dict]:
    """One row per (kernel name, CPU op) with summed time: the store's kernels table rows."""
    if table.empty:
        return []
    grouped = (table.assign(cpu_op=table["cpu_op"].fillna(UNATTRIBUTED_OP))
               .groupby(["name", "cpu_op"], sort=False)
               .agg(total_us=("dur_us", "sum"), count=("dur_us", "size"),
                    category=("category", "first"), tensor_core=("tensor_core", "first"),
                    dtype=("dtype", "first"), reason=("reason", "first"))
               .sort_values("total_us", ascending=False, kind="stable"))
    return [{"name": name, "cpu_op": op, "total_us": _us(row["total_us"]),
             "count": int(row["count"]),
             "category": row["category"], "tensor_core": row["tensor_core"],
             "dtype": _none_if_na(row["dtype"]), "reason": row["reason"]}
            for (name, op), row in grouped.iterrows()]
