"""Trace file -> the few events the analysis keeps, read as a stream.

A Kineto trace is one JSON object whose "traceEvents" list holds every event; real ones are
0.5-2 GB of text, most of it python_function and flow events the analysis never reads. The
reader never holds the text: it decompresses in chunks, cuts the event list at event
boundaries and decodes each piece with msgspec into structs of only the fields the analysis
reads (unknown fields are skipped inside msgspec's C decoder, no dict is built for them).
What is kept is a small tuple per kernel / launch / CPU op / copy / span (each distinct name
once), so memory follows the events kept and their distinct names, not the text. Why
msgspec: docs/architecture.md (trace reading).

Bounds, each named in its refusal: the events kept (PRECISION_LAB_MAX_TRACE_EVENTS), the
distinct names' text (MAX_NAME_MIB), one event's text (MAX_EVENT_MIB: a 2 GiB string or a
bomb of spaces stops there) and the decompressed text read (PRECISION_LAB_MAX_TRACE_MIB:
the time a gzip bomb of dropped events could take).

Anything the fast path does not expect (a value of the wrong shape, a document that is not
a Kineto object) is read again by the plain json path below, which gives the precise
error messages, under the smaller FALLBACK_MAX_MIB bound.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import io
import json
import os
import re
import zlib
from dataclasses import dataclass, field
from typing import IO, Any, Iterator

import msgspec

from engine.traces.events import (
    ANNOTATION_EVENT_CATEGORIES,
    COPY_EVENT_CATEGORIES,
    CPU_OP_EVENT_CATEGORIES,
    KEPT_CATEGORIES,
    KERNEL_EVENT_CATEGORIES,
    LAUNCH_EVENT_CATEGORIES,
    MAX_TIME_US,
    OTHER_DEVICE_PREFIXES,
    RANGE_COUNTERS,
    RANGE_EVENT_CATEGORY,
    SPAN_PREFIXES,
    _BadDuration,
    _CommKernel,
    _Copy,
    _CpuOp,
    _Foreign,
    _Kernel,
    _Launch,
    _Malformed,
    _Range,
    _range_counters,
    _shaped,
    _ShapedOp,
    _Span,
    _stream,
    _time,
    collective_fields,
    compact_dict,
)
from engine.traces.op_flops import SHAPED_OPS

_GZIP_MAGIC = b"\x1f\x8b"

# ---------------------------------------------------------------------------------------
# the typed fast path

# Field types the fast path accepts; a value of another type (a name that is a list, a ts
# written as text) fails the piece's typed decode, and that piece is judged field by field
# by compact_dict instead. gc=False: the structs hold no cycles, so the collector need not
# track millions of them (it was half the decode time).
# An absent Raw field: one shared empty value (a default_factory made 8 objects per event).
_NO_RAW = msgspec.Raw()


class _Args(msgspec.Struct, gc=False):
    correlation: int | str | None = None
    external_id: int | str | None = msgspec.field(default=None, name="External id")
    external_id_lower: int | str | None = msgspec.field(default=None, name="external id")
    device: int | str | None = None
    stream: int | str | None = None
    # text in some ROCm traces ("bytes": "4096"): read as the plain path reads it
    size: int | float | str | None = msgspec.field(default=None, name="bytes")
    ffma: int | float | None = msgspec.field(default=None, name=RANGE_COUNTERS[0])
    fadd: int | float | None = msgspec.field(default=None, name=RANGE_COUNTERS[1])
    fmul: int | float | None = msgspec.field(default=None, name=RANGE_COUNTERS[2])
    hfma: int | float | None = msgspec.field(default=None, name=RANGE_COUNTERS[3])
    hadd: int | float | None = msgspec.field(default=None, name=RANGE_COUNTERS[4])
    hmul: int | float | None = msgspec.field(default=None, name=RANGE_COUNTERS[5])
    dfma: int | float | None = msgspec.field(default=None, name=RANGE_COUNTERS[6])
    dadd: int | float | None = msgspec.field(default=None, name=RANGE_COUNTERS[7])
    dmul: int | float | None = msgspec.field(default=None, name=RANGE_COUNTERS[8])
    # a collective's kernel (Kineto copies record_param_comms' args): Raw, decoded only there
    collective: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Collective name")
    in_nelems: msgspec.Raw = msgspec.field(default=_NO_RAW, name="In msg nelems")
    out_nelems: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Out msg nelems")
    group_size: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Group size")
    dtype: msgspec.Raw = msgspec.field(default=_NO_RAW)
    # Raw: skipped inside the decoder, decoded only for the ops in SHAPED_OPS
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw,
                                                  name="Concrete Inputs")


class _Event(msgspec.Struct, gc=False):
    cat: str | None = None
    name: str | None = None
    ts: float | None = None
    dur: float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: _Args | None = None


_EVENTS = msgspec.json.Decoder(list[_Event])
_NO_ARGS = _Args()


def _keep_foreign(event: "_Event", kept: "Kept") -> None:
    if event.cat != RANGE_EVENT_CATEGORY:
        kept.other_devices[event.cat] = kept.other_devices.get(event.cat, 0) + 1
        return
    args = event.args or _NO_ARGS
    ts, dur = event.ts, event.dur
    if not event.name or not _ok_time(ts) or not _ok_time(dur) or dur < 0:
        kept.defects["malformed_events"] += 1
        return
    kept.ranges.append(_Range((event.name, ts, dur, _range_counters(
        [args.ffma, args.fadd, args.fmul, args.hfma, args.hadd, args.hmul, args.dfma,
         args.dadd, args.dmul]))))


def _raw_value(raw: msgspec.Raw) -> Any:
    """A Raw field's value; an absent field is an empty Raw (msgspec cannot put Raw in a
    union with None: a union there refuses every value but null, and the typed path fails)."""
    return msgspec.json.decode(raw) if len(raw) else None


class _Fallback(Exception):
    """The fast path met something it does not read: the plain path reads it instead."""


def _ok_time(value: float | None) -> bool:
    return value is not None and -MAX_TIME_US <= value <= MAX_TIME_US  # NaN fails both


# What the typed path does with an event, by its category (decided once per category: a
# trace has a few dozen categories and millions of events).
_SKIP, _FOREIGN, _LAUNCH, _ANNOTATION, _KERNEL, _CPU_OP, _COPY, _SPAN = range(8)


def _category_kind(category: str | None) -> int:
    if category not in KEPT_CATEGORIES:
        if category is not None and (category == RANGE_EVENT_CATEGORY
                                     or category.startswith(OTHER_DEVICE_PREFIXES)):
            return _FOREIGN
        return _SKIP
    if category in LAUNCH_EVENT_CATEGORIES:
        return _LAUNCH
    if category in ANNOTATION_EVENT_CATEGORIES:
        return _ANNOTATION
    if category in KERNEL_EVENT_CATEGORIES:
        return _KERNEL
    if category in CPU_OP_EVENT_CATEGORIES:
        return _CPU_OP
    if category in COPY_EVENT_CATEGORIES:
        return _COPY
    return _SPAN


_CATEGORY_KINDS: dict = {}


def _kept_from_structs(events: list[_Event], names: dict, kept: "Kept") -> None:
    """compact() for typed events, whose field types msgspec has checked: the same tuples
    (tests compare both paths on every fixture), without the per-field type checks, each
    appended to its kind's list in `kept`."""
    kernels, launches, ops = kept.kernels.append, kept.launches.append, kept.cpu_ops.append
    defects, ids = kept.defects, kept.ids
    kinds = _CATEGORY_KINDS
    for event in events:
        category = event.cat
        try:
            kind = kinds[category]  # a subscript: cheaper than .get on millions of events
        except KeyError:
            kind = kinds[category] = _category_kind(category)
        if kind <= _FOREIGN:
            if kind == _FOREIGN:
                _keep_foreign(event, kept)
            continue
        args = event.args or _NO_ARGS
        name, ts, dur = event.name, event.ts, event.dur
        # one object per distinct pid / tid (a trace has a few; each decoded value is a new
        # int or str, 30-60 bytes on every one of a million kept events)
        pid, tid = ids.setdefault(event.pid, event.pid), ids.setdefault(event.tid, event.tid)
        if name:
            known = names.get(name)
            if known is None:  # a new name: counted against the bound on names' text
                names[name] = name
                kept.name_chars += len(name)
            else:
                name = known
        else:
            name = ""
        if kind == _LAUNCH:
            external = args.external_id if args.external_id is not None \
                else args.external_id_lower
            launches(_Launch((args.correlation, external, ts if ts is not None else 0.0,
                            pid, tid, name,
                            dur if _ok_time(dur) and dur >= 0 else 0.0)))
            continue
        if kind == _ANNOTATION and not (name is not None and name.startswith(SPAN_PREFIXES)):
            continue
        # _ok_time inlined: this line runs for every kept event
        if ts is None or dur is None or not (-MAX_TIME_US <= ts <= MAX_TIME_US
                                             and 0.0 <= dur <= MAX_TIME_US):
            defects["negative_duration" if _ok_time(dur) and dur < 0
                    else "missing_duration"] += 1
            continue
        if kind == _KERNEL:
            external = args.external_id if args.external_id is not None \
                else args.external_id_lower
            stream = args.stream
            kernels(_Kernel((name, ts, dur, pid, tid, args.correlation, external,
                            stream if type(stream) is int else _stream(stream, tid),
                            args.device)))
            if len(args.collective) and args.correlation is not None:
                fields = collective_fields([_raw_value(raw) for raw in (
                    args.collective, args.in_nelems, args.out_nelems, args.group_size,
                    args.dtype)])
                if fields is not None:
                    kept.collectives[args.correlation] = fields
        elif kind == _CPU_OP:
            external = args.external_id if args.external_id is not None \
                else args.external_id_lower
            op = _CpuOp((name, ts, ts + dur, pid, tid, external))
            ops(op)
            if name in SHAPED_OPS and len(args.input_dims):
                shaped = _shaped(op, _raw_value(args.input_dims), _raw_value(args.input_types),
                                 _raw_value(args.concrete_inputs))
                if type(shaped) is _ShapedOp:
                    kept.shaped_ops.append(shaped)
        elif kind == _COPY:
            size = _time(args.size)
            copy_kind = "memset" if "memset" in category.lower() else "memcpy"
            kept.copies.append(_Copy((name, ts, dur, _stream(args.stream, tid), args.device,
                          int(size) if size is not None and size >= 0 else None, copy_kind,
                          args.correlation)))
        else:
            kept.spans.append(_Span((name, ts, ts + dur, pid, tid)))


# ---------------------------------------------------------------------------------------
# bounds

MAX_TRACE_ENV = "PRECISION_LAB_MAX_TRACE_MIB"
MAX_EVENTS_ENV = "PRECISION_LAB_MAX_TRACE_EVENTS"
# Decompressed text read at most: a bound on time (the reader keeps only what the analysis
# uses, so memory does not follow the text). 16 GiB is ~2 minutes of reading here.
DEFAULT_MAX_TRACE_MIB = 16384
# Events kept at most: the memory bound (~250 bytes each kept; 1 GiB of a V100 ResNet-50
# trace keeps 1.4 M). A bomb of valid kernel events stops here.
DEFAULT_MAX_TRACE_EVENTS = 4_000_000
# One event's text: the largest real ones are a few kB (a CPU op with its input shapes).
MAX_EVENT_MIB = 64
# The distinct names kept (kernel, op and runtime-call names; the longest real kernel name
# here is 5 kB, a trace's distinct names a few MiB).
MAX_NAME_MIB = 256
# The plain path holds the whole text: it reads only what the fast path could not.
FALLBACK_MAX_MIB = 512
_CHUNK = 16 << 20
_MIN_FREE = 1 << 16  # below this much free space the window doubles


class TraceTooLarge(ValueError):
    """The trace is larger than a configured limit (text read, events kept, one event)."""


def _env_positive_int(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    try:
        value = int(text) if text.strip() else default
    except ValueError:
        value = default
    return max(1, value)


def max_trace_bytes() -> int:
    return _env_positive_int(MAX_TRACE_ENV, DEFAULT_MAX_TRACE_MIB) * 2**20


def max_trace_events() -> int:
    return _env_positive_int(MAX_EVENTS_ENV, DEFAULT_MAX_TRACE_EVENTS)


def too_large(source: str, limit: int) -> TraceTooLarge:
    return TraceTooLarge(f"{source}: larger than {limit // 2**20} MiB decompressed, the limit "
                         f"for a trace; set {MAX_TRACE_ENV} to raise it")


# ---------------------------------------------------------------------------------------
# bytes in

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


class _Text:
    """Decompressed bytes of a trace, chunk by chunk, refused past the text bound."""

    def __init__(self, handle: IO[bytes], source: str, limit: int):
        start = handle.tell() if _seekable(handle) else None
        head = handle.read(2)
        if isinstance(head, str):  # a text stream
            head, handle, start = head.encode(), io.BytesIO(handle.read().encode()), None
        if start is not None:  # read from the start again: no prefix to splice in
            handle.seek(start)
            source_handle = handle
        else:
            source_handle = _Prefixed(head, handle)
        self._reader = gzip.GzipFile(fileobj=source_handle) if head == _GZIP_MAGIC \
            else source_handle
        self.source, self.limit, self.total, self.eof = source, limit, 0, False

    def _count(self, size: int) -> int:
        if not size:
            self.eof = True
        self.total += size
        if self.total > self.limit:  # stop reading: a bomb never expands past the limit
            raise too_large(self.source, self.limit)
        return size

    def read(self, size: int = _CHUNK) -> bytes:
        chunk = self._reader.read(size)
        self._count(len(chunk))
        return chunk

    def readinto(self, view: memoryview) -> int:
        """Up to len(view) bytes into `view` (no new buffer: see _Window)."""
        reader = self._reader
        if hasattr(reader, "readinto"):
            return self._count(reader.readinto(view) or 0)
        data = reader.read(len(view))
        view[:len(data)] = data
        return self._count(len(data))


def _seekable(handle: Any) -> bool:
    try:
        return bool(handle.seekable())
    except (AttributeError, OSError, ValueError):
        return False


class _Window:
    """The reader's one buffer, reused from piece to piece: a fresh 16 MiB allocation per
    piece cost more in page faults than reading the file (0.8 s against 0.15 s per GiB).
    data[0] is a placeholder (the "[" or "," before the next event) so that a piece is
    decoded in place as data[0:cut + 1] with "[" and "]" written at its ends."""

    def __init__(self, initial: bytes):
        # sized to what is there, doubling as needed: a 20 kB trace gets a 150 kB buffer
        self.data = bytearray(len(initial) + 1 + _MIN_FREE * 2)
        self.data[0] = 0x5B
        self.data[1:1 + len(initial)] = initial
        self.length = 1 + len(initial)

    def fill(self, text: _Text) -> int:
        if len(self.data) - self.length < _MIN_FREE:  # doubled: a big trace or a long event
            self.data.extend(bytes(len(self.data)))
        free = len(self.data) - self.length
        with memoryview(self.data) as view:
            size = text.readinto(view[self.length:self.length + min(free, _CHUNK)])
        self.length += size
        return size

    def keep_from(self, start: int) -> None:
        """data[start:length] moved to the front (start is the next placeholder)."""
        rest = self.length - start
        self.data[0:rest] = self.data[start:self.length]
        self.length = rest

    def view(self, end: int) -> memoryview:
        return memoryview(self.data)[:end]

    def bytes(self) -> bytes:
        return bytes(self.data[:self.length])


def read_all(handle: IO[bytes], source: str, limit: int) -> bytes:
    """The whole decompressed text (the plain path), refused past `limit`."""
    text, parts = _Text(handle, source, limit), []
    while chunk := text.read():
        parts.append(chunk)
    return b"".join(parts)


# ---------------------------------------------------------------------------------------
# the stream

_MEMBER_DECODER = json.JSONDecoder()
_EVENT_DECODER = json.JSONDecoder(object_hook=compact_dict)


def _skip(text: str, index: int) -> int:
    while index < len(text) and text[index] in " \t\r\n":
        index += 1
    return index


def _members(text: str, index: int, stop_at_events: bool) -> tuple[dict, int]:
    """Walk an object's members from `index` (just after "{" or ","): -> (members, index
    of the events list's "[" or of the closing "}"). ValueError when the text ends inside
    a value (read more) or is not an object."""
    members: dict = {}
    while True:
        index = _skip(text, index)
        if index < len(text) and text[index] == "}":
            return members, index
        key, index = _MEMBER_DECODER.raw_decode(text, index)
        index = _skip(text, index)
        if not isinstance(key, str) or text[index:index + 1] != ":":
            raise _Fallback
        index = _skip(text, index + 1)
        if stop_at_events and key == "traceEvents":
            if text[index:index + 1] != "[":
                raise _Fallback  # not a list: the plain path says what it is
            return members, index
        members[key], index = _MEMBER_DECODER.raw_decode(text, index)
        index = _skip(text, index)
        if text[index:index + 1] == ",":
            index += 1
        elif text[index:index + 1] == "}":
            return members, index
        else:
            raise ValueError("incomplete")


_BOUNDARY_AFTER = re.compile(rb"[ \t\r\n]*,[ \t\r\n]*\{")


def _last_boundary(buffer: bytearray, before: int, length: int) -> int:
    """Index just past the last "}" before `before` that is followed by "," and then "{"
    (the end of an event that has another after it) within buffer[:length], or -1. The
    whitespace between is matched in C: a byte-by-byte walk over a crafted stretch of
    spaces would take minutes."""
    end = before
    while True:
        close = buffer.rfind(b"}", 0, end)
        if close < 0:
            return -1
        if _BOUNDARY_AFTER.match(buffer, close + 1, length):
            return close + 1
        end = close


def _decode_piece(piece: Any, names: dict, kept: Kept) -> int:
    """The events of one piece "[{...}, ..., {...}]" (bytes-like) into `kept`; -> how many
    events the piece held. msgspec.DecodeError: not JSON here (a false boundary)."""
    try:
        events = _EVENTS.decode(piece)
    except msgspec.ValidationError:
        # a field of an odd shape: decode as plain objects and judge each
        return _judged_one_by_one(_plain_objects(piece, msgspec.json.decode), kept)
    except msgspec.DecodeError as exc:
        # JSON as Python's json module writes it (NaN, Infinity) is no false boundary
        try:
            objects = _plain_objects(piece, lambda text: json.loads(bytes(text)))
        except (ValueError, RecursionError):
            raise exc from None
        return _judged_one_by_one(objects, kept)
    _kept_from_structs(events, names, kept)
    return len(events)


def _plain_objects(piece: Any, decode: Any) -> list[dict]:
    try:
        objects = decode(piece)
    except msgspec.DecodeError:
        raise _Fallback from None
    if not isinstance(objects, list) or not all(isinstance(obj, dict) for obj in objects):
        raise _Fallback  # not a list of event objects: the plain path says what it is
    return objects


def _judged_one_by_one(objects: list[dict], kept: "Kept") -> int:
    kept.add_mixed([item for item in map(compact_dict, objects)
                    if item is not None and not isinstance(item, dict)])
    return len(objects)


@dataclass
class Kept:
    """What a trace's reading keeps, by kind (the fast path fills the lists directly; a
    per-event dispatch over a million tuples afterwards cost half a second per GiB)."""

    kernels: list = field(default_factory=list)    # _Kernel
    launches: list = field(default_factory=list)   # _Launch
    cpu_ops: list = field(default_factory=list)    # _CpuOp
    copies: list = field(default_factory=list)     # _Copy
    spans: list = field(default_factory=list)      # _Span
    shaped_ops: list = field(default_factory=list)  # _ShapedOp (their _CpuOp is in cpu_ops)
    ranges: list = field(default_factory=list)      # _Range (CUPTI range profiler)
    # correlation -> (collective, in_nelems, out_nelems, group_size, dtype) of NCCL kernels
    collectives: dict = field(default_factory=dict)
    other_devices: dict = field(default_factory=dict)  # {category: events} of other devices
    defects: dict = field(default_factory=lambda: {
        "malformed_events": 0, "negative_duration": 0, "missing_duration": 0})
    # the distinct names' text (bounded: memory follows it too) and the pid/tid values,
    # each kept once; not part of what two readings are compared by
    name_chars: int = field(default=0, compare=False)
    ids: dict = field(default_factory=dict, compare=False, repr=False)

    def size(self) -> int:
        return len(self.kernels) + len(self.launches) + len(self.cpu_ops) + \
            len(self.copies) + len(self.spans) + len(self.ranges)

    def add_mixed(self, items: list) -> None:
        """Tuples of any kind (the plain path, a piece judged event by event)."""
        lists = {_Kernel: self.kernels, _Launch: self.launches, _CpuOp: self.cpu_ops,
                 _Copy: self.copies, _Span: self.spans}
        for item in items:
            kind = type(item)
            if kind in lists:
                lists[kind].append(item)
            elif kind is _CommKernel:
                self.kernels.append(_Kernel(item[:9]))
                if item[5] is not None:
                    self.collectives[item[5]] = item[9:]
            elif kind is _Range:
                self.ranges.append(item)
            elif kind is _Foreign:
                self.other_devices[item[0]] = self.other_devices.get(item[0], 0) + 1
            elif kind is _ShapedOp:
                self.cpu_ops.append(_CpuOp(item[:6]))
                self.shaped_ops.append(item)
            elif kind is _Malformed:
                self.defects["malformed_events"] += 1
            elif kind is _BadDuration:
                self.defects[f"{item[1]}_duration"] += 1


class _Reading:
    def __init__(self, text: _Text, max_events: int):
        self.text, self.max_events = text, max_events
        self.kept = Kept()
        self.event_count = 0
        self.names: dict = {}

    def add(self, count: int) -> None:
        self.event_count += count
        if self.kept.name_chars > MAX_NAME_MIB * 2**20:
            raise TraceTooLarge(
                f"{self.text.source}: more than {MAX_NAME_MIB} MiB of distinct kernel and op "
                "names, the limit kept from a trace (real traces have a few MiB): not a "
                "profiler trace this reader keeps")
        if self.kept.size() > self.max_events:
            raise too_many_events(self.text.source, self.max_events)


def too_many_events(source: str, limit: int) -> TraceTooLarge:
    return TraceTooLarge(f"{source}: more than {limit:,} kernel, launch and CPU-op events, "
                         f"the limit kept from a trace; set {MAX_EVENTS_ENV} to raise it "
                         "(about 250 bytes of memory each) or profile fewer steps")


def _head(text: _Text) -> tuple[bytes, dict | None]:
    """-> (bytes after the events list's "[", top-level members before it; None for the
    JSON-array format, whose file is the event list)."""
    buffer, size = b"", _MIN_FREE
    while True:
        # small reads first, doubling: a buffered read allocates what it is asked for, and
        # a small trace's whole reading should not cost 16 MiB
        chunk = text.read(size)
        size = min(size * 2, _CHUNK)
        buffer += chunk
        start = buffer.lstrip()[:1]
        if start == b"[":
            return buffer.lstrip()[1:], None
        if start != b"{":
            raise _Fallback
        decoded = buffer.decode("utf-8", "ignore")  # a cut multi-byte character is re-read
        try:
            members, index = _members(decoded, decoded.index("{") + 1, stop_at_events=True)
        except ValueError:
            if text.eof or len(buffer) > MAX_EVENT_MIB * 2**20:
                raise _Fallback from None
            continue
        if decoded[index] != "[":
            raise _Fallback  # no events list
        return buffer[len(decoded[:index + 1].encode()):], members


def _tail(reading: _Reading, buffer: bytes, is_object: bool) -> dict:
    """The last events (plain decoder, one at a time: they end where the list ends) and the
    members after the list."""
    try:
        decoded = buffer.decode("utf-8")
    except UnicodeDecodeError:
        raise _Fallback from None
    index, items, count = _skip(decoded, 0), [], 0
    try:
        while decoded[index:index + 1] != "]":
            item, index = _EVENT_DECODER.raw_decode(decoded, index)
            count += 1
            if isinstance(item, tuple):
                items.append(item)
            elif not (item is None or isinstance(item, dict)):
                raise _Fallback
            index = _skip(decoded, index)
            if decoded[index:index + 1] == ",":
                index = _skip(decoded, index + 1)
            elif decoded[index:index + 1] != "]":
                raise _Fallback
        reading.kept.add_mixed(items)
        reading.add(count)
        index = _skip(decoded, index + 1)
        if not is_object:
            if index != len(decoded):
                raise _Fallback
            return {}
        if decoded[index:index + 1] == ",":
            index += 1
        members, index = _members(decoded, index, stop_at_events=False)
    except TraceTooLarge:
        raise  # a bound, not an odd document: the plain path must not read it instead
    except (ValueError, IndexError, RecursionError):
        raise _Fallback from None
    if _skip(decoded, index + 1) != len(decoded):
        raise _Fallback
    return members


# At the end the last events are read by the plain decoder: past this point of the last
# buffer a "},{" may be inside the members after the list (deviceProperties), not events.
_TAIL_GUARD = 1 << 20


def stream_events(handle: IO[bytes], source: str) -> tuple["Kept", int, dict]:
    """-> (what is kept, events read, top-level members other than traceEvents).
    Raises _Fallback for what the plain path should read, TraceTooLarge past a bound."""
    with collector_paused():
        return _stream_events(handle, source)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a trace is read and analysed: a trace keeps
    millions of small tuples, and each full pass of the collector over them took as long
    as the work it interrupted (0.4 s a pass on 1 GiB). Nothing made there holds a cycle;
    refcounting frees it all as usual. Nested uses restore what the outermost found."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _stream_events(handle: IO[bytes], source: str) -> tuple["Kept", int, dict]:
    text = _Text(handle, source, max_trace_bytes())
    reading = _Reading(text, max_trace_events())
    rest, head = _head(text)
    window = _Window(rest)
    max_event_bytes = MAX_EVENT_MIB * 2**20
    while True:
        if not text.eof and window.length < _CHUNK:
            window.fill(text)
            continue
        length = window.length
        limit = length if not text.eof else length - _TAIL_GUARD
        cut = _last_boundary(window.data, limit, length) if limit > 0 else -1
        if cut < 0:
            if text.eof:
                break
            if length > max_event_bytes:
                raise TraceTooLarge(f"{source}: an event (or text between events) longer than "
                                    f"{MAX_EVENT_MIB} MiB, so not a profiler trace event")
            window.fill(text)
            continue
        comma = window.data.index(b",", cut, length)
        after_cut = window.data[cut]
        window.data[0], window.data[cut] = 0x5B, 0x5D  # "[", "]"
        try:
            with window.view(cut + 1) as piece:
                reading.add(_decode_piece(piece, reading.names, reading.kept))
        except RecursionError:
            raise _Fallback from None
        except msgspec.DecodeError:
            # a "},{" inside a string or inside the members after the list: the plain path
            # is exact; it is read at the end with the rest when the file ends here
            window.data[cut] = after_cut
            if text.eof:
                break
            window.fill(text)
            if window.length > max_event_bytes * 2:
                raise _Fallback from None
            continue
        window.keep_from(comma)  # the comma is the next placeholder
    members = _tail(reading, window.bytes()[1:], head is not None)
    if head is not None:
        members = {**head, **members}
    return reading.kept, reading.event_count, members


def open_source(path_or_fileobj: Any) -> tuple[IO[bytes], bool]:
    """-> (binary handle, whether we opened it and must close it)."""
    if isinstance(path_or_fileobj, (str, os.PathLike)):
        return open(path_or_fileobj, "rb"), True
    return path_or_fileobj, False


READ_ERRORS = (OSError, EOFError, zlib.error, gzip.BadGzipFile)
