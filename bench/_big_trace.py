"""A large trace made from a real one: its steps repeated until the text reaches a size.

Each repetition is the real trace shifted in time past the previous one, with its
correlation and External ids offset (so launches still pair with their kernels and ops)
and its ProfilerStep numbers continued. What the analysis computes per step is therefore
the real trace's, repeated: the figures of the big trace are known in advance.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_ID_KEYS = ("correlation", "External id", "external id")


def _load(source: Path) -> tuple[dict, list[dict]]:
    opener = gzip.open if source.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(source, "rb") as handle:
        data = json.load(handle)
    return data, data["traceEvents"]


def _span(events: list[dict]) -> tuple[float, float, int, int]:
    """(first ts, last end, largest id, largest step) of the real trace."""
    starts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    ends = [e["ts"] + e.get("dur", 0) for e in events
            if isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]
    ids = [v for e in events if isinstance(e.get("args"), dict)
           for k, v in e["args"].items() if k in _ID_KEYS and isinstance(v, int)]
    steps = [int(m.group(1)) for e in events
             if isinstance(e.get("name"), str) and (m := _STEP.match(e["name"]))]
    return min(starts), max(ends), max(ids, default=0), max(steps, default=0)


def _shifted(event: dict, shift_us: float, id_offset: int, step_offset: int) -> dict:
    copy = dict(event)
    if isinstance(copy.get("ts"), (int, float)):
        copy["ts"] = copy["ts"] + shift_us
    args = copy.get("args")
    if isinstance(args, dict):
        args = dict(args)
        for key in _ID_KEYS:
            if isinstance(args.get(key), int) and args[key] > 0:
                args[key] += id_offset
        copy["args"] = args
    name = copy.get("name")
    if isinstance(name, str) and (match := _STEP.match(name)):
        copy["name"] = f"ProfilerStep#{int(match.group(1)) + step_offset}"
    if copy.get("ph") in ("s", "f") and isinstance(copy.get("id"), int):
        copy["id"] += id_offset  # flow events pair a launch with its kernel by id
    return copy


def build(source: Path, target: Path, target_bytes: int) -> dict:
    """Write `target` (plain JSON) by repeating `source` until it holds `target_bytes`.
    -> {"bytes", "repeats", "events", "steps_per_repeat"}."""
    data, events = _load(source)
    first_us, last_us, largest_id, largest_step = _span(events)
    period_us = (last_us - first_us) * 1.01 + 1000.0
    members = {k: v for k, v in data.items() if k != "traceEvents"}
    written, repeats, count = 0, 0, 0
    with open(target, "w", encoding="utf-8") as out:
        head = json.dumps(members)[1:-1]
        out.write("{" + head + (", " if head else "") + '"traceEvents": [\n')
        while written < target_bytes:
            lines = [json.dumps(_shifted(e, repeats * period_us, repeats * (largest_id + 1),
                                         repeats * (largest_step + 1))) for e in events]
            text = ("" if repeats == 0 else ",\n") + ",\n".join(lines)
            out.write(text)
            written += len(text)
            repeats += 1
            count += len(lines)
        out.write("\n]}\n")
    steps = sum(1 for e in events if isinstance(e.get("name"), str) and _STEP.match(e["name"]))
    return {"bytes": target.stat().st_size, "repeats": repeats, "events": count,
            "steps_per_repeat": steps}
