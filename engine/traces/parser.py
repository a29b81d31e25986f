"""Profiler trace file -> kernel table: the parser. What ran (kernels, copies, launches,
CPU ops, profiler-step spans), on which device, each kernel attributed to the CPU op that
launched it. The judging (Tensor-Core verdict, breakdown, causes) is engine.traces.verdict.

Input: a PyTorch profiler (Kineto) Chrome trace, `.json` or `.json.gz`. Kernel events have
`cat` "kernel" (old traces: "Kernel"), `dur` in microseconds and `args.correlation`, which
links each kernel to the CUDA runtime/driver call that launched it; that call carries the
`External id` of the CPU op (aten::mm, ...) it ran under. A trace is read as a stream
(engine.traces.reader: memory follows the events kept, bounds named in their
refusals) and events it cannot read are counted, not fatal.
"""

from __future__ import annotations

import bisect
import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import IO, Any

from engine.hardware.gpus import compute_capability_from_name
from engine.traces.events import (
    MAX_TIME_US,
    SPAN_PREFIXES,
    _CpuOp,
    _Kernel,
    _Launch,
    _Span,
    compact_dict,
)
from engine.traces.kernel_table import TABLE_COLUMNS, KernelTable
from engine.traces.kernels import classify_kernel
from engine.traces.op_flops import dtype_of
from engine.traces.reader import (
    FALLBACK_MAX_MIB,
    READ_ERRORS,
    Kept,
    TraceTooLarge,
    _Fallback,
    collector_paused,
    max_trace_bytes,
    max_trace_events,
    open_source,
    read_all,
    stream_events,
    too_large,
    too_many_events,
)

__all__ = ["MAX_TIME_US", "SPAN_PREFIXES", "TABLE_COLUMNS", "ParsedTrace", "TraceTooLarge",
           "load_kernel_table", "load_trace", "trace_device", "trace_metadata"]



# ---------------------------------------------------------------------------------------
# reading

def _source_name(path_or_fileobj: Any) -> str:
    if isinstance(path_or_fileobj, (str, os.PathLike)):
        return os.fspath(path_or_fileobj)
    return str(getattr(path_or_fileobj, "name", "<trace stream>"))


def _cannot_read(source: str, exc: BaseException) -> ValueError:
    reason = getattr(exc, "strerror", None) or str(exc)
    return ValueError(f"{source}: cannot read trace file: {reason}")


def _parse_trace(path_or_fileobj: Any) -> tuple[Kept, int, dict]:
    """-> (kept events, events read, top-level members: deviceProperties,
    distributedInfo, ...). The streaming reader first
    (engine.traces.reader); what it does not expect is read again by the plain
    path, whose messages say exactly what is wrong. ValueError naming the source if it is
    not a Chrome trace with events."""
    source = _source_name(path_or_fileobj)
    try:
        handle, owned = open_source(path_or_fileobj)
        try:
            kept, count, members = stream_events(handle, source)
        finally:
            if owned:
                handle.close()
    except _Fallback:
        return _parse_plain(path_or_fileobj, source)
    except TraceTooLarge:
        raise
    except READ_ERRORS as exc:  # missing, unreadable, corrupt gzip
        raise _cannot_read(source, exc) from exc
    if not count:
        raise _no_events(source)
    return kept, count, members


def _parse_plain(path_or_fileobj: Any, source: str) -> tuple[Kept, int, dict]:
    """The whole text through the stdlib decoder (what the streaming reader did not expect:
    its errors name the defect); bounded by FALLBACK_MAX_MIB, as it holds the text."""
    limit = min(max_trace_bytes(), FALLBACK_MAX_MIB * 2**20)
    try:
        if isinstance(path_or_fileobj, (str, os.PathLike)):
            with open(path_or_fileobj, "rb") as handle:
                raw = read_all(handle, source, limit)
        else:
            path_or_fileobj.seek(0)
            raw = read_all(path_or_fileobj, source, limit)
    except TraceTooLarge:
        if limit < max_trace_bytes():
            raise TraceTooLarge(f"{source}: not a Kineto trace the streaming reader follows "
                                f"(a JSON object with a 'traceEvents' list) and larger than "
                                f"{FALLBACK_MAX_MIB} MiB, the limit for reading it whole") from None
        raise too_large(source, limit) from None
    except READ_ERRORS as exc:
        raise _cannot_read(source, exc) from exc
    start = raw[:4096].lstrip()[:1]
    if start and start not in b"{[":  # binary or text that is not a JSON document
        # Its kind, never its bytes: a file a link led to may hold anything (/etc/passwd).
        raise ValueError(f"{source}: content that is neither gzip nor JSON ({_kind(raw)}), "
                         "so not a profiler trace (.json or .json.gz)")
    # The event cap applies while decoding: a crafted file of millions of kernel events
    # must be refused after the cap's worth of them, not after all are built (a 510 MiB
    # one took the app server to 6.7 GiB).
    cap, kept_so_far = max_trace_events(), [0]

    def bounded_hook(obj: dict) -> Any:
        item = compact_dict(obj)
        if isinstance(item, tuple):
            kept_so_far[0] += 1
            if kept_so_far[0] > cap:
                raise too_many_events(source, cap)
        return item

    try:
        data = json.loads(raw, object_hook=bounded_hook)
    except TraceTooLarge:
        raise
    except RecursionError:
        raise ValueError(f"{source}: JSON nested too deeply to be a profiler trace") from None
    except UnicodeDecodeError:
        raise ValueError(f"{source}: content that is neither gzip nor JSON text, so not a "
                         "profiler trace (.json or .json.gz)") from None
    except ValueError as exc:
        raise ValueError(f"{source}: not a JSON trace file ({exc})") from exc
    del raw
    if isinstance(data, list):  # Chrome "JSON array" format: the file is the event list
        if not all(event is None or isinstance(event, (tuple, dict)) for event in data):
            raise ValueError(f"{source}: a JSON list that is not a list of trace events "
                             "(objects with 'ph'/'cat'), so not a profiler trace")
        return _kept(data, source), len(data), {}
    if isinstance(data, dict) and "traceEvents" in data and not isinstance(
            data["traceEvents"], list):
        raise ValueError(f"{source}: 'traceEvents' is a {type(data['traceEvents']).__name__}, "
                         "not a list of events, so not a profiler trace")
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        keys = ", ".join(sorted(data)[:8]) if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{source}: no 'traceEvents' list, so not a PyTorch profiler "
                         f"(Chrome trace) file; found: {keys or 'nothing'}. Export one with "
                         "torch.profiler's on_trace_ready=tensorboard_trace_handler or "
                         "prof.export_chrome_trace(path).")
    events = data.pop("traceEvents")
    return _kept(events, source), len(events), data


_MAGIC_KINDS = ((b"\x89PNG\r\n\x1a\n", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"),
                (b"GIF8", "a GIF image"), (b"%PDF", "a PDF document"),
                (b"PK\x03\x04", "a zip archive"), (b"\x7fELF", "an executable (ELF)"),
                (b"BZh", "a bzip2 archive"), (b"\xfd7zXZ\x00", "an xz archive"),
                (b"\x28\xb5\x2f\xfd", "a zstd archive"),
                (b"SQLite format 3\x00", "an SQLite database"))


def _kind(raw: bytes) -> str:
    """What a file that is not a trace holds, in words ("a PNG image", "plain text",
    "binary data"): a message names the kind, never the file's bytes."""
    for magic, words in _MAGIC_KINDS:
        if raw.startswith(magic):
            return words
    head = raw[:4096]
    for cut in range(4):  # the head may end inside a multi-byte character
        try:
            text = head[:len(head) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        if all(ch.isprintable() or ch in "\t\r\n\f" for ch in text):
            return "plain text"
        break
    return "binary data"


def _kept(events: list, source: str) -> Kept:
    if not events:
        raise _no_events(source)
    kept = Kept()
    kept.add_mixed([event for event in events if isinstance(event, tuple)])
    if kept.size() > max_trace_events():  # the same bound as the streaming reader's
        raise too_many_events(source, max_trace_events())
    return kept


def _no_events(source: str) -> ValueError:
    return ValueError(f"{source}: the trace has no events: the profiler recorded nothing "
                      "(was the schedule's active window reached, and prof.step() called?)")


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

_AMD_NAMES = re.compile(r"\bAMD\b|Radeon|Instinct|(?<![A-Za-z])MI\d{2,3}[A-Z]?\b")
_AMD_KERNELS = re.compile(r"^Cijk_|ck::|ck_tile::|rocblas|hipblaslt|miopen|igemm_\w*gtc")


def _device_from_properties(properties: list[dict], kernels: list[_Kernel]) -> dict:
    """-> {name, compute_capability, vendor, arch} of the GPU the kernels ran on (most
    kernels' device). vendor is "nvidia", "amd" or None; an AMD GPU never gets an NVIDIA
    compute capability (HIP reports gfx942 as "9.4", which is no sm90)."""
    counts: dict[Any, int] = defaultdict(int)
    for kernel in kernels:
        counts[kernel[8]] += 1
    device_index = max(counts, key=counts.get) if counts else None
    chosen = next((entry for entry in properties if entry.get("id") == device_index),
                  properties[0] if properties else None)
    name = chosen.get("name") if chosen and isinstance(chosen.get("name"), str) else None
    vendor = _vendor(chosen or {}, name, kernels)
    arch = chosen.get("gcnArchName") if chosen else None
    arch = arch.split(":", 1)[0] if isinstance(arch, str) and arch else None
    if vendor == "amd":
        return {"name": name, "compute_capability": None, "vendor": vendor, "arch": arch}
    major, minor = (
        (chosen.get("computeMajor"), chosen.get("computeMinor")) if chosen else (None, None)
    )
    if not (isinstance(major, int) and isinstance(minor, int)) or isinstance(major, bool):
        major = minor = None  # crafted or missing
    capability = f"{major}.{minor}" if major is not None else None
    return {"name": name, "compute_capability": capability or compute_capability_from_name(name),
            "vendor": vendor, "arch": None}


def _vendor(entry: dict, name: str | None, kernels: list[_Kernel]) -> str | None:
    """From the device properties (ROCm traces name an AMD GPU and carry gcnArchName),
    else from library kernel names only AMD's stack emits."""
    if "gcnArchName" in entry or (name and _AMD_NAMES.search(name)):
        return "amd"
    if name or isinstance(entry.get("computeMajor"), int):
        return "nvidia"
    for kernel in kernels[:2000]:
        if _AMD_KERNELS.search(kernel[0]):
            return "amd"
    return "nvidia" if kernels else None


# ---------------------------------------------------------------------------------------
# public: table

@dataclass
class ParsedTrace:
    """One parse of a trace file: the classified kernel table plus what the time
    accounting needs (copy-engine events, record_function spans, CPU ops, runtime calls)
    and the trace's defects. Build it once with load_trace and pass it around: a 100 MB
    trace is not parsed twice."""

    source: str
    table: KernelTable
    copies: list = field(default_factory=list)      # _Copy
    spans: list = field(default_factory=list)       # _Span
    cpu_ops: list = field(default_factory=list)     # _CpuOp
    launches: list = field(default_factory=list)    # _Launch
    shaped_ops: list = field(default_factory=list)  # _ShapedOp: matrix ops with shapes
    ranges: list = field(default_factory=list)      # _Range: CUPTI range-profiler kernels
    # correlation -> (collective, in_nelems, out_nelems, group_size, dtype): NCCL kernels
    collectives: dict = field(default_factory=dict)
    other_devices: dict = field(default_factory=dict)  # {category: events}: MTIA, XPU, ...
    defects: dict = field(default_factory=dict)     # {"negative_duration": n, ...}
    # the job's rank and world size when the trace says them (Kineto's distributedInfo)
    distributed: dict = field(default_factory=dict)

    @property
    def is_gpu(self) -> bool:
        return not self.table.empty or bool(self.copies)

    @property
    def kind(self) -> str:
        """"gpu" (a kernel timeline), "range profiler" (CUPTI per-kernel counters, no
        kernel events), "other accelerator" (MTIA, XPU, ...: no CUDA/ROCm kernels) or
        "cpu" (CPU ops only)."""
        if self.is_gpu:
            return "gpu"
        if self.ranges:
            return "range profiler"
        if self.other_devices:
            return "other accelerator"
        return "cpu"


def load_trace(path_or_fileobj: str | os.PathLike | IO[bytes]) -> ParsedTrace:
    """Parse a trace once. Raises ValueError naming the file when it cannot be read or is
    not a profiler trace."""
    with collector_paused():  # see trace_reader.collector_paused
        return _load_trace(path_or_fileobj)


def _load_trace(path_or_fileobj: str | os.PathLike | IO[bytes]) -> ParsedTrace:
    kept, event_count, members = _parse_trace(path_or_fileobj)
    source = _source_name(path_or_fileobj)
    properties = members.get("deviceProperties")
    properties = properties if isinstance(properties, list) else []
    distributed = members.get("distributedInfo")
    kernels, all_launches, ops, copies = kept.kernels, kept.launches, kept.cpu_ops, kept.copies
    shaped_ops, ranges, other_devices = kept.shaped_ops, kept.ranges, kept.other_devices
    collectives = kept.collectives
    launches = {event[0]: event for event in all_launches if event[0] is not None}
    # old schema: ProfilerStep and the other spans are CPU ops
    spans = kept.spans + [_Span(op[:5]) for op in ops if op[0].startswith(SPAN_PREFIXES)]
    defects = kept.defects
    if not (kernels or all_launches or ops or copies or spans or ranges or other_devices):
        raise ValueError(f"{source}: {event_count:,} event(s), none of "
                         "them a profiler event (kernel, CPU op, runtime call, memcpy/memset, "
                         "annotation), so not a PyTorch profiler trace")
    del kept
    entries = [entry for entry in properties if isinstance(entry, dict)]
    device = _device_from_properties(entries, kernels)
    table = _build_table(kernels, launches, ops, shaped_ops)
    table.attrs.update(source=source, device=device["name"],
                       compute_capability=device["compute_capability"],
                       vendor=device["vendor"], arch=device["arch"],
                       malformed_events=defects["malformed_events"],
                       bad_duration_events=defects["negative_duration"]
                       + defects["missing_duration"])
    return ParsedTrace(source=source, table=table, copies=copies, spans=spans, cpu_ops=ops,
                       launches=all_launches, shaped_ops=shaped_ops, ranges=ranges,
                       other_devices=other_devices, collectives=collectives,
                       defects=defects,
                       distributed=_distributed(distributed))


def _distributed(info: Any) -> dict:
    """{"rank", "world_size", "backend"} of distributedInfo, the ones that are sane."""
    if not isinstance(info, dict):
        return {}
    kept = {key: info[key] for key in ("rank", "world_size")
            if isinstance(info.get(key), int) and not isinstance(info[key], bool)
            and 0 <= info[key] < 1_000_000}
    if isinstance(info.get("backend"), str):
        kept["backend"] = info["backend"][:40]
    return kept


def load_kernel_table(path_or_fileobj: str | os.PathLike | IO[bytes]):
    """One row per GPU kernel event, classified, as a pandas DataFrame. Columns:
    TABLE_COLUMNS.

    `table.attrs` carries source, device (name), compute_capability, vendor, arch and the
    defect counts. Raises ValueError naming the file when it cannot be read or is not a
    profiler trace. Kernels whose time is missing, negative or impossible are left out (counted in
    attrs["bad_duration_events"]).
    """
    return load_trace(path_or_fileobj).table.to_pandas()


def _build_table(kernels: list[_Kernel], launches: dict, ops: list[_CpuOp],
                 shaped_ops: list | None = None) -> KernelTable:
    if not kernels:
        return KernelTable()
    external_ids, cpu_ops = _attribute_kernels(kernels, launches, ops)
    names = [k[0] for k in kernels]
    verdicts = {name: classify_kernel(name) for name in set(names)}
    order = sorted(range(len(kernels)), key=lambda i: kernels[i][1])  # stable: by start
    columns = {
        "name": [names[i] for i in order],
        "dur_us": [float(kernels[i][2]) for i in order],
        "ts_us": [float(kernels[i][1]) for i in order],
        "stream": [kernels[i][7] for i in order],
        "device": [_int_or_none(kernels[i][8]) for i in order],
        "correlation": [_int_or_none(kernels[i][5]) for i in order],
        "external_id": [_int_or_none(external_ids[i]) for i in order],
        "cpu_op": [cpu_ops[i] for i in order],
    }
    for column in ("category", "tensor_core", "dtype", "reason"):
        columns[column] = [getattr(verdicts[name], column) for name in columns["name"]]
    _dtypes_from_ops(columns, [kernels[i] for i in order], launches, shaped_ops or [])
    return KernelTable(columns)


def _dtypes_from_ops(columns: dict, kernels: list[_Kernel], launches: dict,
                     shaped_ops: list) -> None:
    """A matrix kernel whose name says no dtype (AOTriton's `attn_fwd`, a Triton template)
    takes the dtype of the tensors its op was given (the trace's `Input type`): what ran,
    not a guess. Kernels whose names say one keep it."""
    wanted = [index for index, (category, dtype) in
              enumerate(zip(columns["category"], columns["dtype"]))
              if dtype is None and category in ("gemm", "conv", "attention")]
    if not wanted or not shaped_ops:
        return
    by_thread: dict[tuple, list] = defaultdict(list)
    for op in shaped_ops:
        by_thread[(op[3], op[4])].append(op)
    starts = {}
    for key, thread_ops in by_thread.items():
        thread_ops.sort(key=lambda op: op[1])
        starts[key] = [op[1] for op in thread_ops]
    for index in wanted:
        launch = launches.get(kernels[index][5])
        if launch is None:
            continue
        key, ts = (launch[3], launch[4]), launch[2]
        # the ops that started last before the launch: a nest (linear > addmm) is a few deep
        last = bisect.bisect_right(starts.get(key, []), ts)
        around = [op for op in by_thread.get(key, [])[max(0, last - 8):last] if ts <= op[2]]
        if around:
            innermost = min(around, key=lambda op: op[2] - op[1])
            dtype = next((dtype_of(name) for name in innermost[7] if dtype_of(name)), None)
            columns["dtype"][index] = dtype


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError, OverflowError):  # OverflowError: a float inf
        return None


def trace_metadata(path_or_fileobj: str | os.PathLike | IO[bytes]) -> dict:
    """{"source", "device", "compute_capability", "kernel_count"} of a trace file."""
    table = load_trace(path_or_fileobj).table
    return {**table.attrs, "kernel_count": int(len(table))}


def trace_device(path_or_fileobj: str | os.PathLike | IO[bytes]) -> str | None:
    """Name of the GPU the trace's kernels ran on (deviceProperties), or None."""
    return trace_metadata(path_or_fileobj)["device"]
