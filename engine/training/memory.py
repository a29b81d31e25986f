"""What holds a training step's memory: the two peaks a run reports and the split of one.

Two figures, two names, on every surface:
- tensor peak (`tensor_peak_bytes`): the bytes held by tensors at the step's peak. CUDA:
  the caching allocator's peak allocated bytes. CPU: the allocator keeps no peak counter,
  so one step is profiled (`profile_memory=True`) and its highest "Total Allocated" above
  the start is added to what lives across steps (weights, optimizer state).
- process peak (`process_peak_bytes`): what the process held. CPU: its peak resident set
  (getrusage), which also counts the Python interpreter, PyTorch's libraries and freed
  blocks the allocator keeps. CUDA: the allocator's peak reserved bytes on the GPU.

The tensor peak is split by kind (memory_by_kind): parameters, gradients and optimizer
state counted exactly from the model and the optimizer; the rest of the measured peak is
activations, the autocast cast cache and kernel workspace.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch

from engine.training.step_meter import memory_snapshot

# A Trainer (engine.training.loop), which imports this module: named, not imported.
Trainer = Any

def _local_bytes(tensor: torch.Tensor) -> int:
    """The bytes this process holds for `tensor`: an FSDP2 DTensor's local shard, not the
    whole tensor its numel() describes."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def parameter_bytes(trainer: Trainer) -> int:
    return int(sum(_local_bytes(p) for p in trainer.module.parameters()))


def optimizer_state_bytes(trainer: Trainer) -> int:
    return int(sum(_local_bytes(v) for state in trainer.optimizer.state.values()
                   for v in state.values() if isinstance(v, torch.Tensor)))


def resident_bytes(trainer: Trainer) -> int:
    """Weights and optimizer state (gradients are freed after each step)."""
    return parameter_bytes(trainer) + optimizer_state_bytes(trainer)


def memory_by_kind(trainer: Trainer, peak_bytes: int | None) -> dict[str, Any] | None:
    """A tensor peak split by what holds it: parameters, optimizer state and gradients
    counted exactly from the model and the optimizer (a gradient per trainable parameter,
    in its dtype, all alive at the step's peak); no mode here keeps separate fp32 master
    copies (autocast computes from the fp32 weights, bf16-pure updates bf16 weights in
    place); the rest of the measured peak is activations, the autocast cast cache and
    kernel workspace."""
    if peak_bytes is None:
        return None
    params = parameter_bytes(trainer)
    grads = int(sum(_local_bytes(p) for p in trainer.params))
    state = optimizer_state_bytes(trainer)
    counted = params + grads + state
    return {"parameters_bytes": params, "gradients_bytes": grads,
            "optimizer_state_bytes": state, "master_copies_bytes": 0,
            "rest_bytes": max(0, int(peak_bytes) - counted), "peak_bytes": int(peak_bytes),
            "counted_exceeds_peak": counted > peak_bytes}


def cpu_step_peak_increment(run_step: Callable[[], Any]) -> int:
    """Peak bytes allocated above the start while `run_step` runs (the CPU allocator, as
    the profiler's memory events report it: "Total Allocated" counts from 0 at its start)."""
    from torch.profiler import ProfilerActivity, profile  # only for this one step

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run_step()
    handle, path = tempfile.mkstemp(suffix=".json")
    os.close(handle)
    try:
        prof.export_chrome_trace(path)
        with open(path) as trace:
            events = json.load(trace).get("traceEvents", [])
    finally:
        os.unlink(path)
    totals = [event["args"].get("Total Allocated", 0) for event in events
              if event.get("name") == "[memory]" and isinstance(event.get("args"), dict)
              and event["args"].get("Device Type", 0) == 0]
    return max([0, *totals])


class TensorPeakProbe:
    """The tensor peak of a CPU run: the last warm-up step is profiled for its
    allocations (a warm-up step is never timed, and by then the optimizer's state exists,
    so the step's increment is activations, gradients and workspace alone). CUDA needs no
    probe: the allocator keeps its own peak."""

    MIN_WARMUP_STEPS = 2  # step 1 allocates the optimizer's state: not a typical step

    def __init__(self, warmup_steps: int, device: torch.device):
        self.device = device
        self.step = warmup_steps if warmup_steps >= self.MIN_WARMUP_STEPS else None
        self.increment_bytes: int | None = None
        self.error: str | None = None

    def wants(self, step: int) -> bool:
        return self.device.type != "cuda" and step == self.step

    def run(self, work: Callable[[], Any]) -> Any:
        """`work` (one training step) under the profiler; its result. A profiler that
        fails leaves the tensor peak unmeasured (with why), never the run."""
        result: list[Any] = []
        started: list[bool] = []

        def step() -> None:
            started.append(True)
            result.append(work())

        try:
            self.increment_bytes = cpu_step_peak_increment(step)
        except Exception as exc:  # noqa: BLE001 - the peak is informative
            if started and not result:
                raise  # the step itself failed: the run's own error
            self.error = f"the profiler could not measure it ({type(exc).__name__})"
        if not started:  # the profiler failed before the step: the step runs unprofiled
            return work()
        return result[0]

    def unmeasured_reason(self) -> str | None:
        if self.device.type == "cuda" or self.increment_bytes is not None:
            return None
        if self.error:
            return self.error
        if self.step is None:
            return (f"not measured: a CPU run measures it on its last warm-up step and needs "
                    f"warmup_steps {self.MIN_WARMUP_STEPS} or more")
        return "not measured: the run ended before its last warm-up step"


def run_memory_figures(trainer: Trainer, probe: TensorPeakProbe) -> dict[str, Any]:
    """The two peaks of a run and the tensor peak's split, for its summary."""
    device = trainer.device
    if device.type == "cuda":
        tensor_peak = int(torch.cuda.max_memory_allocated(device))
        process_peak = int(torch.cuda.max_memory_reserved(device))
    else:
        tensor_peak = (None if probe.increment_bytes is None
                       else resident_bytes(trainer) + probe.increment_bytes)
        process_peak = _peak_rss_bytes()
    return {"tensor_peak_bytes": tensor_peak, "process_peak_bytes": process_peak,
            "memory_by_kind": memory_by_kind(trainer, tensor_peak),
            "tensor_peak_note": probe.unmeasured_reason()}


def _peak_rss_bytes() -> int | None:
    return memory_snapshot(torch.device("cpu"))["mem_peak_bytes"]
