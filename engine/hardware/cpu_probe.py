"""This machine's oneDNN probe, stored: per dtype, which implementation ran one small
matmul and one convolution forward + backward, and how fast each op ran against fp32.

The flags say what a CPU could do; the probe says what oneDNN did with it here, before
any run (a CPU with AVX512-FP16 can still run fp16 convolution backward in oneDNN's
reference code, 37x slower than fp32 in one measured layer). The probe runs in
engine.diagnostics.onednn_probe (it needs torch); this module only keeps its record,
like the peaks (engine.hardware.peaks): in `$PRECISION_LAB_HOME/cpu_probe_cache.json`,
keyed by device, CPU name and torch build (the torch build carries the oneDNN that
decides), measured when missing (doctor, a run's profiler window) and replaced by every
device check. No torch here: the pages read it.
"""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from engine.proc import make_private
from engine.store import default_home

CACHE_FILENAME = "cpu_probe_cache.json"
RECORD_VERSION = 1
PROBE_DTYPES = ("fp32", "bf16", "fp16")
OPS = ("matmul", "conv")  # conv = one convolution forward + backward (data and weights)


def cache_path() -> Path:
    return default_home() / CACHE_FILENAME


def torch_build_version() -> str:
    """The installed torch's version from its package metadata (no import)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"


def cache_key(device_key: str, device_name: str) -> str:
    return f"{device_key}|{device_name}|torch {torch_build_version()}"


def read_cache() -> dict[str, Any]:
    try:
        with open(cache_path(), encoding="utf-8") as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):  # missing or half-written: probed again when asked
        return {}


def unusable_reason(record: Any) -> str | None:
    """Why a stored probe record must not be used (None: it may)."""
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        return "recorded by another version of the probe"
    dtypes = record.get("dtypes")
    if not isinstance(dtypes, dict) or "fp32" not in dtypes:
        return "no fp32 baseline in the record"
    return None


def stored_probe(device_key: str, device_name: str) -> dict[str, Any] | None:
    """This device's usable probe record, or None (never measures)."""
    record = read_cache().get(cache_key(device_key, device_name))
    return record if unusable_reason(record) is None else None


def probe_for_dtype(device_key: str, device_name: str, dtype: str) -> dict[str, Any] | None:
    """One dtype of the stored probe: {"ops": {op: {...}}, "speed_vs_fp32": {op: x},
    "busy": whether the machine was busy while it was measured}."""
    record = stored_probe(device_key, device_name)
    entry = (record or {}).get("dtypes", {}).get(dtype)
    return {**entry, "busy": bool(record.get("busy"))} if entry and record else entry


def write_probe(device_key: str, device_name: str, record: dict[str, Any]) -> None:
    """Store a probe record (atomic replace: concurrent readers never see a torn file)."""
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = read_cache()
        data[cache_key(device_key, device_name)] = record
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        make_private(tmp)  # the data directory's files are owner-only
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only data dir only costs a probe next time


def conv_rates(record: dict[str, Any] | None) -> dict[str, dict[str, float]]:
    """{op: {dtype: FLOP/s}} from a probe record: each kind of op at its own measured
    rate (the what-if projects a convolution at the conv rate, a matmul at the matmul
    rate)."""
    rates: dict[str, dict[str, float]] = {op: {} for op in OPS}
    for dtype, entry in ((record or {}).get("dtypes") or {}).items():
        for op, measured in (entry.get("ops") or {}).items():
            flops = measured.get("flops_per_s")
            if op in rates and isinstance(flops, (int, float)) and flops > 0:
                rates[op][dtype] = float(flops)
    return rates
