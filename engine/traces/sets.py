"""A set of traces from one job, one per rank: the per-rank table, the slowest rank, and
the communication time that was waiting for the other ranks.

Input: a folder of rank traces, several files, or a zip of them. Each trace is analysed
alone (engine.traces.accounting); across ranks this module adds:
- the rank of each trace: Kineto's distributedInfo.rank, else a number in the file name
  ("rank-3.json.gz", "worker3"), else the order given;
- the slowest rank by step time, and by how much it is above the median rank;
- waiting in collectives: a collective ends on every rank together, so the i-th
  communication kernel of a rank running longer than the shortest rank's i-th is time that
  rank spent waiting for the others; a rank that waits clearly less than the others tends
  to arrive last (named only when the gap is at least CLEAR_WAIT_GAP of the communication
  time). The kernels in each rank's window are matched by order and name; where the
  ranks' sequences stop agreeing the matching stops, and the result says how many were
  matched (collectives of one name throughout, as DDP's buckets, are matched by order
  alone: a window that starts one collective late on one rank is not detected).
- the start skew of each matched collective: the latest rank's start minus the earliest's,
  the rank that came last, their median and largest, and how often each rank was last;
- every time in a rank's row is per step (the window over its step count).
"""

from __future__ import annotations

import os
import re
import statistics
import zipfile
from pathlib import Path
from typing import IO, Any

from engine.traces.accounting import time_accounting
from engine.traces.parser import ParsedTrace, load_trace
from engine.traces.reader import collector_paused

TRACE_SUFFIXES = (".json", ".json.gz", ".gz")
# A job's ranks read one after another; more than this is a mistake, not a job to show.
MAX_RANKS = 256
_RANK_IN_NAME = re.compile(r"(?:rank|worker|proc|gpu)[-_ ]?(\d+)", re.IGNORECASE)
_LAST_NUMBER = re.compile(r"(\d+)(?!.*\d)")


def _is_trace_name(name: str) -> bool:
    base = os.path.basename(name)
    return not base.startswith(".") and base.lower().endswith(TRACE_SUFFIXES)


def set_members(paths: list[Path]) -> list[tuple[str, Any]]:
    """(label, path or zip member) of every trace in `paths`: folders listed (one level,
    sorted), zips opened, files as they are. ValueError naming the path when nothing in
    it is a trace or it holds more than MAX_RANKS."""
    members: list[tuple[str, Any]] = []
    for path in paths:
        if not path.exists():
            raise ValueError(f"{path}: no such file or folder; give rank traces (.json or "
                             ".json.gz), a folder of them or a zip")
        try:
            members += _members_of(path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise ValueError(f"{path}: cannot read it ({exc}); give rank traces (.json or "
                             ".json.gz), a folder of them or a zip") from None
    if len(members) > MAX_RANKS:
        raise ValueError(f"{len(members)} traces: more than {MAX_RANKS}, the most one trace set "
                         "shows; pass the ranks of one job")
    return members


def _members_of(path: Path) -> list[tuple[str, Any]]:
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.is_file() and _is_trace_name(p.name))
        if not found:
            raise ValueError(f"{path}: no trace files in this folder (.json or .json.gz)")
        for member in found:
            _refuse_link_outside(member, path)
        return [(p.name, p) for p in found]
    if zipfile.is_zipfile(path):
        return _zip_members(path)
    return [(path.name, path)]


def _refuse_link_outside(member: Path, folder: Path) -> None:
    """A folder's symbolic link must stay inside the folder: one leading elsewhere would
    make the app read (and quote from) any file the server can read."""
    if not member.is_symlink():
        return
    target = member.resolve()
    if not target.is_relative_to(folder.resolve()):
        raise ValueError(f"{member}: a symbolic link that leads outside the folder {folder}; "
                         "copy the trace into the folder instead of linking to it")


def _zip_members(path: Path) -> list[tuple[str, Any]]:
    with zipfile.ZipFile(path) as archive:
        names = sorted(info.filename for info in archive.infolist()
                       if not info.is_dir() and _is_trace_name(info.filename))
    if not names:
        raise ValueError(f"{path}: a zip with no trace files in it (.json or .json.gz)")
    first_of: dict[str, str] = {}
    for name in names:  # the table shows the file name: two alike would read as two ranks
        base = os.path.basename(name)
        if base in first_of:
            raise ValueError(f"{path}: two traces named {base!r} ({first_of[base]} and {name}); "
                             "a trace set holds one trace per rank: zip one job's ranks")
        first_of[base] = name
    return [(os.path.basename(name), _ZipMember(path, name)) for name in names]


class _ZipMember:
    """A trace inside a zip, opened only when read (one rank in memory at a time)."""

    def __init__(self, archive: Path, name: str):
        self.archive, self.name = archive, name

    def open(self) -> IO[bytes]:
        return _NamedZipStream(zipfile.ZipFile(self.archive), self.name)

    def __str__(self) -> str:
        return f"{self.archive}:{self.name}"


class _NamedZipStream:
    """A zip member as a binary stream named "archive.zip:member" (errors name it)."""

    def __init__(self, archive: zipfile.ZipFile, name: str):
        self._archive = archive
        self._stream = archive.open(name)
        self.name = f"{archive.filename}:{name}"

    def read(self, size: int = -1) -> bytes:
        return self._stream.read(size)

    def readinto(self, buffer) -> int:
        return self._stream.readinto(buffer)

    def seekable(self) -> bool:
        return self._stream.seekable()

    def tell(self) -> int:
        return self._stream.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._stream.seek(offset, whence)

    def close(self) -> None:
        self._stream.close()
        self._archive.close()


# What a zip or a folder can raise that is the file's fault, not the code's: a bad CRC or
# a truncated archive, an encrypted member, a compression method zipfile lacks.
_ARCHIVE_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, RuntimeError, NotImplementedError,
                   OSError, EOFError)


def _load(source: Any) -> ParsedTrace:
    if not isinstance(source, _ZipMember):
        return load_trace(source)
    try:
        stream = source.open()
        try:
            return load_trace(stream)
        finally:
            stream.close()
    except ValueError:
        raise  # the reader's own message, naming archive:member
    except _ARCHIVE_ERRORS as exc:
        raise ValueError(f"{source}: cannot read this member of the zip ({exc}); zip the "
                         "traces again without encryption (deflate or stored)") from None


# ---------------------------------------------------------------------------------------
# one rank

def _communication_kernels(trace: ParsedTrace, window: dict
                           ) -> list[tuple[str, float, float, tuple | None]]:
    """(name, dur_us, start_us, collective fields or None) of the communication kernels
    that start in the window, in order."""
    table, lo, hi = trace.table, window["start_us"], window["end_us"]
    return [(name, dur, start, trace.collectives.get(correlation))
            for name, start, dur, category, correlation in zip(
                table["name"].tolist(), table["ts_us"].tolist(), table["dur_us"].tolist(),
                table["category"].tolist(), table["correlation"].tolist())
            if category == "communication" and lo <= start < hi]


# nccl-tests' bus bandwidth (its PERFORMANCE.md): algorithm bandwidth (bytes over time) times
# the share of the data each rank's link carries, so figures compare with the link's peak.
_BUS_FACTORS = (("all_reduce", lambda n: 2 * (n - 1) / n), ("allreduce", lambda n: 2 * (n - 1) / n),
                ("reduce_scatter", lambda n: (n - 1) / n), ("reducescatter", lambda n: (n - 1) / n),
                ("allgather", lambda n: (n - 1) / n), ("all_gather", lambda n: (n - 1) / n),
                ("alltoall", lambda n: (n - 1) / n), ("all_to_all", lambda n: (n - 1) / n),
                ("broadcast", lambda n: 1.0), ("reduce", lambda n: 1.0), ("send", lambda n: 1.0),
                ("recv", lambda n: 1.0))
_DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8,
                "Byte": 1, "Char": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1}


def bus_bandwidth(fields: tuple, transfer_us: float) -> tuple[str, float, float] | None:
    """(collective, bytes, bus GB/s) of one collective from its Kineto args and its time;
    None when the collective or dtype is one the table does not know. The size is the
    larger of its input and output (an all-gather's output, a reduce-scatter's input)."""
    name, in_nelems, out_nelems, group, dtype = fields
    size = _DTYPE_BYTES.get(dtype or "")
    lowered = name.lower()
    factor = next((f for key, f in _BUS_FACTORS if key in lowered), None)
    if not size or factor is None or transfer_us <= 0 or group < 1:
        return None
    moved = max(in_nelems, out_nelems) * size
    return name, float(moved), moved / (transfer_us * 1e-6) * factor(group) / 1e9


def _per_step(us: float | None, steps: int) -> float | None:
    return None if us is None else round(us / max(1, steps), 3)


def _rank_row(label: str, trace: ParsedTrace) -> dict:
    """One rank's figures, every time per step (the window over its step count), as the
    step time is: a row reads across in one unit."""
    accounting = time_accounting(trace)
    gpu = accounting["kind"] == "gpu"
    span = accounting.get("gpu_span") or {}
    steps = accounting["window"]["step_count"]
    communication = accounting.get("communication_us") if gpu else \
        accounting["parts_us"].get("communication")
    return {
        "source": label,
        "trace_rank": trace.distributed.get("rank"),
        "world_size": trace.distributed.get("world_size"),
        "kind": accounting["kind"],
        "device": trace.table.attrs.get("device"),
        "step_count": steps,
        "step_time_us": accounting["step_time_us"],
        "busy_us": _per_step(accounting["busy_us"], steps),
        "busy_share": accounting["busy_share"],
        "idle_share": accounting["idle_share"],
        "idle_in_gpu_span_share": span.get("idle_in_gpu_span_share"),
        "communication_us": _per_step(communication, steps),
        "exposed_communication_us": _per_step(
            accounting.get("exposed_communication_us") if gpu else communication, steps),
        "_comm": _communication_kernels(trace, accounting["window"]),
    }


def _assign_ranks(rows: list[dict], files: list[str]) -> None:
    """rank: the trace's own when every trace has a distinct one, else the number in the
    file name when those are distinct, else the order given; rank_from says which.
    ValueError naming both files when two traces say (or are named for) the same rank."""
    def distinct(values: list) -> bool:
        return None not in values and len(set(values)) == len(values)

    own = [row["trace_rank"] for row in rows]
    named = []
    for row in rows:
        match = _RANK_IN_NAME.search(row["source"]) or _LAST_NUMBER.search(row["source"])
        named.append(int(match.group(1)) if match else None)
    _refuse_twice(own, files, "the trace's distributedInfo says rank")
    if None in own:
        _refuse_twice(named, files, "the file name says rank")
    if distinct(own):
        ranks, origin = own, "the trace (distributedInfo)"
    elif distinct(named):
        ranks, origin = named, "the file name"
    else:
        ranks, origin = list(range(len(rows))), "the order given"
    for row, rank in zip(rows, ranks):
        row["rank"], row["rank_from"] = rank, origin


def _refuse_twice(ranks: list, files: list[str], how: str) -> None:
    first_of: dict = {}
    for rank, file in zip(ranks, files):
        if rank is None:
            continue
        if rank in first_of:
            raise ValueError(f"two traces of rank {rank}: {first_of[rank]} and {file} ({how} "
                             f"{rank} in both); a trace set holds one trace per rank: pass "
                             "each rank's trace once")
        first_of[rank] = file


# ---------------------------------------------------------------------------------------
# across ranks

def _waiting(rows: list[dict]) -> dict:
    """Per rank, the communication time spent waiting for the other ranks (see module
    doc); how many collectives were matched and why the matching stopped, if it did."""
    sequences = [row.pop("_comm") for row in rows]
    if not all(sequences):
        for row in rows:
            row["waiting_us"] = row["waiting_share_of_communication"] = None
        if all(row["kind"] == "cpu" for row in rows):
            return {"matched": 0, "reason": "waiting: n/a for CPU traces (gloo collectives run "
                    "as CPU ops, with no collective kernels to line up across ranks)"}
        missing = [row["rank"] for row, seq in zip(rows, sequences) if not seq]
        return {"matched": 0, "reason": "waiting: n/a, no communication kernels in the trace "
                "of rank " + ", ".join(str(r) for r in missing[:8])}
    matched = 0
    waits = [0.0] * len(rows)
    skews: list[tuple[float, int, str]] = []  # (start skew, last rank's index, name)
    bandwidths: list[tuple[str, float, float]] = []  # (collective, bytes, bus GB/s)
    for index in range(min(len(seq) for seq in sequences)):
        names = {seq[index][0] for seq in sequences}
        if len(names) > 1:
            break  # the ranks ran different collectives here: nothing to line up after it
        durations = [seq[index][1] for seq in sequences]
        shortest = min(durations)
        for rank_index, duration in enumerate(durations):
            waits[rank_index] += duration - shortest
        starts = [seq[index][2] for seq in sequences]
        last = max(range(len(starts)), key=starts.__getitem__)
        skews.append((starts[last] - min(starts), last, sequences[0][index][0]))
        fields = sequences[0][index][3]
        if fields is not None:  # the transfer: the time of the rank that waited least
            rated = bus_bandwidth(fields, shortest)
            if rated is not None:
                bandwidths.append(rated)
        matched += 1
    counts = sorted({len(seq) for seq in sequences})
    for row, wait in zip(rows, waits):
        row["waiting_us"] = _per_step(wait, row["step_count"]) if matched else None
        comm = row.get("communication_us")
        row["waiting_share_of_communication"] = (
            round(row["waiting_us"] / comm, 8) if matched and comm else None)
    reason = None
    if matched < max(counts):
        reason = (f"{matched} of {max(counts)} collectives matched: the ranks' communication "
                  "kernels stop agreeing in order and name there" if matched < min(counts)
                  else f"{matched} collectives matched: the ranks recorded {counts[0]}-"
                  f"{counts[-1]} communication kernels")
    return {"matched": matched, "reason": reason, "skew": _skew_summary(skews, rows),
            "bandwidth": _bandwidth_summary(bandwidths)}


def _bandwidth_summary(bandwidths: list[tuple[str, float, float]]) -> list[dict]:
    """Per collective kind: how many, the median message size and bus bandwidth."""
    by_name: dict[str, list] = {}
    for name, moved, bus in bandwidths:
        by_name.setdefault(name, []).append((moved, bus))
    return [{"collective": name, "count": len(items),
             "median_bytes": statistics.median(m for m, _b in items),
             "median_bus_gb_per_s": round(statistics.median(b for _m, b in items), 3),
             "max_bus_gb_per_s": round(max(b for _m, b in items), 3)}
            for name, items in sorted(by_name.items(), key=lambda kv: -len(kv[1]))]


def _skew_summary(skews: list[tuple[float, int, str]], rows: list[dict]) -> dict | None:
    """Per matched collective, how far its start was spread across the ranks (latest minus
    earliest start: the time the first rank waited before the last arrived) and which rank
    came last; summed up as the median and largest skew, each rank's last arrivals, and the
    most skewed collectives. Starts are compared on the traces' own clocks: ranks on
    different hosts need their clocks in step (NTP/PTP) for the skew to mean waiting."""
    if not skews:
        return None
    last_counts: dict[Any, int] = {}
    for _skew, last, _name in skews:
        rank = rows[last]["rank"]
        last_counts[rank] = last_counts.get(rank, 0) + 1
    worst = sorted(skews, key=lambda item: -item[0])[:10]
    most_last = max(last_counts, key=last_counts.get)
    return {
        "collectives": len(skews),
        "median_us": round(statistics.median(s[0] for s in skews), 3),
        "max_us": round(worst[0][0], 3),
        "last_arrivals": last_counts,
        "most_often_last": {"rank": most_last, "count": last_counts[most_last]},
        "worst": [{"index": skews.index(item), "name": item[2], "skew_us": round(item[0], 3),
                   "last_rank": rows[item[1]]["rank"]} for item in worst],
    }


def _slowest(rows: list[dict]) -> dict | None:
    timed = [row for row in rows if row.get("step_time_us")]
    if len(timed) < 2:
        return None
    slowest = max(timed, key=lambda row: row["step_time_us"])
    median_us = statistics.median(row["step_time_us"] for row in timed)
    fastest = min(timed, key=lambda row: row["step_time_us"])
    return {"rank": slowest["rank"], "step_time_us": slowest["step_time_us"],
            "median_step_time_us": round(median_us, 3),
            "above_median_share": round(slowest["step_time_us"] / median_us - 1.0, 8)
            if median_us else None,
            "fastest_rank": fastest["rank"], "fastest_step_time_us": fastest["step_time_us"]}


# Below this excess over the median rank the steps are said to be even (the slowest is
# still named: a figure, not a verdict).
EVEN_STEPS = 0.01
# The least-waiting rank is named only when it waits clearly less than the others: by at
# least this share of the median rank's communication time per step.
CLEAR_WAIT_GAP = 0.10


def _waited_for(rows: list[dict]) -> dict | None:
    """The rank the others waited for: the one that waits least in collectives, when it
    waits clearly less (else the waits are comparable: no straggler to name)."""
    waited = [row for row in rows if row.get("waiting_us") is not None]
    if len(waited) < 2:
        return None
    least = min(waited, key=lambda row: row["waiting_us"])
    others = [row["waiting_us"] for row in waited if row is not least]
    median_comm = statistics.median(row.get("communication_us") or 0.0 for row in waited)
    gap = statistics.median(others) - least["waiting_us"]
    return {"rank": least["rank"], "waiting_us": least["waiting_us"],
            "others_median_waiting_us": round(statistics.median(others), 3),
            "clear": bool(median_comm) and gap >= CLEAR_WAIT_GAP * median_comm}


def set_sentence(result: dict) -> str:
    """One line: how many ranks, the slowest and by how much, who the others waited for."""
    parts = [f"{result['rank_count']} rank traces"]
    slowest = result.get("slowest")
    if slowest:
        above = slowest["above_median_share"] or 0.0
        parts.append(("" if above >= EVEN_STEPS else "steps within 1 % of each other, ")
                     + f"slowest rank {slowest['rank']}: {slowest['step_time_us'] / 1000:.2f} ms "
                     f"per step, {above * 100:.1f} % above the median rank "
                     f"({slowest['median_step_time_us'] / 1000:.2f} ms)")
    waited = result.get("waited_for")
    if waited and waited["clear"]:
        parts.append(f"rank {waited['rank']} waits least in collectives "
                     f"({waited['waiting_us'] / 1000:.2f} ms per step, the others' median "
                     f"{waited['others_median_waiting_us'] / 1000:.2f} ms): it tends to arrive "
                     "last, the others wait for it")
    elif waited:
        parts.append(f"the ranks wait comparably in collectives (least "
                     f"{waited['waiting_us'] / 1000:.2f} ms per step, the others' median "
                     f"{waited['others_median_waiting_us'] / 1000:.2f} ms): no rank the others "
                     "wait for")
    return "; ".join(parts)


def analyze_set(members: list[tuple[str, Any]]) -> dict:
    """The trace-set view of `members` ((label, path or stream) per rank trace; see
    set_members), read one after another in this process. ValueError for fewer than two
    traces or one that cannot be read (the message names the file). In worker processes:
    engine.traces.set_workers.analyze_set_parallel; on Ray: engine.cluster.ray_traces."""
    if len(members) < 2:
        raise ValueError(f"a trace set needs the traces of two or more ranks; got "
                         f"{len(members)}")
    with collector_paused():  # every rank's read and accounting (trace_reader.collector_paused)
        rows = [_rank_row(label, _load(source)) for label, source in members]
    return finish_set(rows, [str(source) for _label, source in members])


def rank_row(label: str, source: Any) -> dict:
    """One rank's row, as analyze_set makes it: what a worker process or a Ray task
    computes where the trace is (its `_comm` list is JSON-safe)."""
    with collector_paused():
        return _rank_row(label, _load(source))


def finish_set(rows: list[dict], files: list[str], failed: list[dict] | None = None) -> dict:
    """The set view of rank rows computed anywhere (here, in worker processes, on a Ray
    cluster): ranks assigned, waiting, skew, slowest; `failed` ({"source", "error"}) are
    the ranks that could not be read, each one line in the result."""
    failed = failed or []
    if len(rows) < 2:
        reasons = "; ".join(f"{f['source']}: {f['error']}" for f in failed[:4])
        raise ValueError(f"a trace set needs two or more readable rank traces; {len(rows)} "
                         f"read" + (f" ({reasons})" if reasons else ""))
    _assign_ranks(rows, files)
    rows.sort(key=lambda row: row["rank"])
    waiting = _waiting(rows)
    result = {"kind": "trace_set", "rank_count": len(rows), "ranks": rows,
              "rank_from": rows[0]["rank_from"], "collectives_matched": waiting["matched"],
              "collectives_note": waiting["reason"], "collective_skew": waiting.get("skew"),
              "collective_bandwidth": waiting.get("bandwidth") or [],
              "slowest": _slowest(rows),
              "waited_for": _waited_for(rows), "failed_ranks": failed}
    result["sentence"] = set_sentence(result)
    return result
