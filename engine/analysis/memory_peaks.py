"""A run's two memory peaks by name, the same on every surface (Live, Runs, Compare, the
report, `show`), from what its summary holds (engine.training.memory writes them).

Runs recorded before the two names existed hold one `peak_mem_bytes`: on a GPU that is
the allocator's peak (the tensor peak), on a CPU the process's peak resident set (the
process peak); it is read as what it was, never as the other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from engine.display import (
    NA,
    PROCESS_PEAK_NAME,
    TENSOR_PEAK_NAME,
    memory_split_text,
    memory_text,
)

TENSOR_PEAK_NOT_RECORDED = ("not recorded: a run records it when it ends (a CPU run measures "
                            "it on its last warm-up step)")


def _bytes(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if math.isfinite(value) and value > 0 else None


def is_gpu_device(device_key: str | None) -> bool:
    """A run's device key names a GPU ("cuda:0"; ROCm builds use "cuda" too)."""
    return str(device_key or "").startswith("cuda")


def memory_peaks(summary: Mapping[str, Any], device_key: str | None,
                 metric_peak_bytes: Any = None) -> dict[str, Any]:
    """tensor_peak_bytes, process_peak_bytes, memory_by_kind and tensor_peak_note of a
    run; `metric_peak_bytes`: the largest mem_peak_bytes its metric rows logged (the
    memory chart's figure, the same kind as peak_mem_bytes), while no summary has one."""
    on_gpu = is_gpu_device(device_key)
    legacy = _bytes(summary.get("peak_mem_bytes")) or _bytes(metric_peak_bytes)
    tensor = _bytes(summary.get("tensor_peak_bytes"))
    process = _bytes(summary.get("process_peak_bytes"))
    if tensor is None and on_gpu:
        tensor = legacy
    if process is None and not on_gpu:
        process = legacy
    note = summary.get("tensor_peak_note")
    if tensor is None and not note:
        note = TENSOR_PEAK_NOT_RECORDED  # running, or ended before its summary was written
    split = summary.get("memory_by_kind")
    return {"tensor_peak_bytes": tensor, "process_peak_bytes": process,
            "memory_by_kind": split if isinstance(split, Mapping) else None,
            "tensor_peak_note": None if tensor is not None else note}


def memory_words(peaks: Mapping[str, Any], device_key: str | None) -> str:
    """The two peaks in one sentence, each by its name, with the tensor peak's split (or
    why it is missing): Live's caption under the memory tile, the same words as `show`."""
    tensor, process = peaks.get("tensor_peak_bytes"), peaks.get("process_peak_bytes")
    if is_gpu_device(device_key):
        process_meaning = "the allocator's peak reserved GPU memory"
    else:
        process_meaning = ("the process's peak resident set: the interpreter, PyTorch's "
                           "libraries and freed blocks the allocator keeps, besides tensors")
    if tensor is not None:
        tensor_part = f"{TENSOR_PEAK_NAME.capitalize()} {memory_text(tensor)}"
        split = memory_split_text(peaks.get("memory_by_kind"))
        tensor_part += f" ({split})" if split != NA else ""
    else:
        tensor_part = (f"{TENSOR_PEAK_NAME.capitalize()}: "
                       f"{peaks.get('tensor_peak_note') or 'not measured'}")
    return (f"{tensor_part}. {PROCESS_PEAK_NAME.capitalize()} {memory_text(process)}: "
            f"{process_meaning}.")
