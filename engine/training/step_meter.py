"""The step meter: the training loop's bookkeeping between log boundaries, so the loop reads
as the loop. It owns the interval being timed (steps, start, the batch source's wait and
copy counters at its start), the steady-state totals the run's result is made of, the
device-side count of skipped steps, the last loss scale, and the metric row a log step
emits.

The loop asks it once per step whether the step is logged (`should_log`) and, at a sync
point, hands it the step's figures once (`log`): the interval is closed, a steady one added
to the totals, the row made when the step is logged, and the next interval started.

Timing is by interval, not by step: the loop syncs the device only at log boundaries and
phase changes, and an interval's step time is its elapsed time over its step count. Only
steady intervals enter the totals (warm-up and the profiler window are slower on purpose).
The meter is given what it reads (the batch source, the GradScaler, the device, the sizes
of a step), not the trainer: it depends on nothing of the loop.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from engine.schema import STEADY, plausible_mfu
from engine.training.input_pipeline import BatchSource


@dataclass
class Interval:
    """The steps between two log boundaries."""
    start_s: float
    steps: int = 0
    wait_start_s: float = 0.0   # the batch source's cumulative wait at the start
    copy_start_s: float | None = None

    @classmethod
    def starting(cls, source: BatchSource) -> "Interval":
        return cls(start_s=time.perf_counter(), wait_start_s=source.wait_s,
                   copy_start_s=source.copy_s)

    def input_ms(self, source: BatchSource) -> tuple[float, float | None]:
        """(data wait, host-to-device copy) per step over this interval, in ms."""
        wait = (source.wait_s - self.wait_start_s) * 1000.0 / max(self.steps, 1)
        copy = (None if source.copy_s is None or self.copy_start_s is None
                else (source.copy_s - self.copy_start_s) * 1000.0 / max(self.steps, 1))
        return wait, copy


@dataclass(frozen=True)
class IntervalReading:
    """One closed interval: per-step figures and when it was measured."""
    step_time_ms: float
    data_wait_ms: float
    h2d_copy_ms: float | None
    measured_at_s: float
    steps: int


class StepMeter:
    """Interval timing, steady totals, the skipped-step count and the metric rows of one
    run (or one rank of it)."""

    # what it reads, fixed for the run
    source: BatchSource            # its wait_s / copy_s counters time the input pipeline
    scaler: torch.amp.GradScaler | None
    device: torch.device
    samples_per_step: int          # all ranks together
    tokens_per_sample: int | None  # sequence models only
    flops_per_step: float | None   # all ranks together; None: not counted
    peak_flops: float | None       # FLOP/s of the device at this precision; None: no MFU
    log_interval_steps: int
    total_steps: int
    # what it keeps
    interval: Interval             # the steps since the last sync point
    run_start_s: float             # perf_counter at the start: a row's wall_time_s
    steady_time_s: float
    steady_steps: int
    steady_wait_s: float
    steady_copy_s: float
    loss_scale: float | None       # the GradScaler's scale at the last logged step
    first_loss: float | None
    final_loss: float | None
    _skipped: torch.Tensor         # on the device: reading it every step would sync the host

    def __init__(self, *, source: BatchSource, scaler: torch.amp.GradScaler | None,
                 device: torch.device, samples_per_step: int, tokens_per_sample: int | None,
                 flops_per_step: float | None, peak_flops: float | None,
                 log_interval_steps: int, total_steps: int):
        self.source, self.scaler, self.device = source, scaler, device
        self.samples_per_step, self.tokens_per_sample = samples_per_step, tokens_per_sample
        self.flops_per_step, self.peak_flops = flops_per_step, peak_flops
        self.log_interval_steps, self.total_steps = log_interval_steps, total_steps
        self._skipped = torch.zeros((), dtype=torch.int64, device=device)
        self.loss_scale = self.first_loss = self.final_loss = None
        self.steady_time_s = self.steady_wait_s = self.steady_copy_s = 0.0
        self.steady_steps = 0
        self.run_start_s = time.perf_counter()
        self.interval = Interval.starting(source)

    def should_log(self, step: int) -> bool:
        """Whether `step` emits a metric row: every `log_interval_steps`, and the last."""
        return step % self.log_interval_steps == 0 or step == self.total_steps

    def step_done(self, grad_norm: torch.Tensor | None) -> None:
        """After every step: one more step in the interval; a GradScaler run's non-finite
        gradient norm is a skipped step (counted on the device, no sync)."""
        self.interval.steps += 1
        if self.scaler is not None:
            self._skipped += (~torch.isfinite(grad_norm)).to(torch.int64)

    def log(self, step: int, phase: str, loss_value: float, grad_norm: torch.Tensor | None,
            lr: float) -> dict[str, Any] | None:
        """At a sync point (the caller has synced the device and read the loss): close the
        interval (a steady one joins the totals), start the next from this measurement
        (logging and flushing count against throughput like any other cost of the
        instrumented loop) and return the step's metric row when it is logged, else None."""
        reading = self._close_interval(phase)
        row = (self._metric_row(step, phase, loss_value, grad_norm, reading, lr)
               if self.should_log(step) else None)
        self.restart(at_s=reading.measured_at_s)
        return row

    def restart(self, at_s: float | None = None) -> None:
        """A new interval. From `at_s` (a measurement), or from now: time that is not a
        step (a trace export) is left out."""
        self.interval = Interval.starting(self.source)
        if at_s is not None:
            self.interval.start_s = at_s

    @property
    def skipped_steps(self) -> int:
        return int(self._skipped.item()) if self.scaler is not None else 0

    def _close_interval(self, phase: str) -> IntervalReading:
        measured_at_s = time.perf_counter()
        steps = self.interval.steps
        elapsed_s = measured_at_s - self.interval.start_s
        wait_ms, copy_ms = self.interval.input_ms(self.source)
        if phase == STEADY:
            self.steady_time_s += elapsed_s
            self.steady_steps += steps
            self.steady_wait_s += wait_ms * steps / 1000.0
            self.steady_copy_s += (copy_ms or 0.0) * steps / 1000.0
        return IntervalReading(step_time_ms=elapsed_s * 1000.0 / steps, data_wait_ms=wait_ms,
                               h2d_copy_ms=copy_ms, measured_at_s=measured_at_s, steps=steps)

    def _metric_row(self, step: int, phase: str, loss_value: float,
                    grad_norm: torch.Tensor | None, reading: IntervalReading,
                    lr: float) -> dict[str, Any]:
        """The metrics row of a log step (reads the loss scale: one host sync)."""
        if self.scaler is not None:
            self.loss_scale = float(self.scaler.get_scale())
        self.first_loss = loss_value if self.first_loss is None else self.first_loss
        self.final_loss = loss_value
        step_time_ms = reading.step_time_ms
        samples_per_s = (self.samples_per_step * 1000.0 / step_time_ms if step_time_ms > 0
                         else None)
        achieved_flops = (self.flops_per_step * 1000.0 / step_time_ms
                          if self.flops_per_step and step_time_ms > 0 else None)
        row = {
            "step": step, "wall_time_s": time.perf_counter() - self.run_start_s,
            "loss": loss_value, "lr": lr,
            "step_time_ms": step_time_ms, "samples_per_s": samples_per_s,
            "tokens_per_s": _tokens_per_s(samples_per_s, self.tokens_per_sample),
            "loss_scale": self.loss_scale, "skipped_steps": self.skipped_steps,
            "grad_norm": float(grad_norm.item()) if grad_norm is not None else None,
            "achieved_tflops": achieved_flops / 1e12 if achieved_flops else None,
            "mfu": plausible_mfu(achieved_flops, self.peak_flops),
            "phase": phase,
            "host_busy": None,  # the session marks it from the contention sampler
            "data_wait_ms": reading.data_wait_ms, "h2d_copy_ms": reading.h2d_copy_ms,
        }
        row.update(memory_snapshot(self.device))
        return row

    def steady_figures(self) -> dict[str, Any]:
        """The run's result figures over its steady steps (TrainResult's fields)."""
        time_s, steps = self.steady_time_s, self.steady_steps
        samples_per_s = steps * self.samples_per_step / time_s if time_s else None
        return {
            "samples_per_s": samples_per_s,
            "tokens_per_s": _tokens_per_s(samples_per_s, self.tokens_per_sample),
            "step_time_ms": time_s * 1000.0 / steps if steps else None,
            "achieved_tflops": (self.flops_per_step * steps / time_s / 1e12
                                if self.flops_per_step and time_s else None),
            "data_wait_ms": self.steady_wait_s * 1000.0 / steps if steps else None,
            "h2d_copy_ms": (self.steady_copy_s * 1000.0 / steps
                            if steps and self.source.copy_s is not None else None),
            "data_wait_share": self.steady_wait_s / time_s if time_s else None,
            "first_loss": self.first_loss, "final_loss": self.final_loss,
            "loss_scale_final": self.loss_scale if self.scaler is not None else None,
            "skipped_steps": self.skipped_steps,
        }


def _tokens_per_s(samples_per_s: float | None, tokens_per_sample: int | None) -> float | None:
    return samples_per_s * tokens_per_sample if samples_per_s and tokens_per_sample else None


def memory_snapshot(device: torch.device) -> dict[str, int | None]:
    """The memory columns of a metric row: the CUDA allocator's figures on a GPU; on a
    CPU only the process's resident set (now, and its peak as mem_peak_bytes)."""
    if device.type == "cuda":
        return {
            "mem_allocated_bytes": torch.cuda.memory_allocated(device),
            "mem_reserved_bytes": torch.cuda.memory_reserved(device),
            "mem_peak_bytes": torch.cuda.max_memory_allocated(device),
            "rss_bytes": _rss_bytes(),
        }
    rss = _rss_bytes()
    peak = _peak_rss_bytes()
    # The two come from different kernel counters (getrusage's high-water mark, statm's
    # page count) and the peak can read a few hundred KiB under the resident set just read:
    # a peak is never below the present, so the larger of the two is the peak so far.
    if peak is not None and rss is not None:
        peak = max(peak, rss)
    return {"mem_allocated_bytes": None, "mem_reserved_bytes": None,
            "mem_peak_bytes": peak, "rss_bytes": rss}


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def _peak_rss_bytes() -> int | None:
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux
    except (ImportError, OSError):
        return None


try:
    _PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
    _PAGE_SIZE = 4096
