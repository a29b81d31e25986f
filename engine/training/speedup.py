"""The paired speedup measurement: 2-4 precision modes of one workload, interleaved.

Why interleaved in one process: separate runs measured minutes apart see different load,
clocks and temperatures, and their ratio is that noise as much as the precision. Here
every mode has its own model copy and optimizer (built once, same seed: same initial
weights and the same batches in the same order), and the modes take turns in short
blocks of steps: a round is one block of every mode, in an order drawn at random for each
round. Load that comes and goes then hits every mode of a round alike, and the paired
per-round ratios cancel it; what it does not cancel (a burst that lands on one block) lands
on a mode chosen by the draw, never on the same position's mode every time, which is what
makes the interval's 95 % hold under bursty load (statistics: engine.analysis.speedup).

- warm-up: every mode runs `warmup_steps` (at least WARMUP_STEPS_MIN) untimed steps, then
  one untimed calibration block that also sets the block length (BLOCK_TARGET_S per
  block for the slowest mode, so switching costs are amortised);
- stop: when every mode's 95 % interval is within `speedup_target_pct` of its speedup
  (after MIN_ROUNDS rounds), or the time budget is spent, or a stop is requested;
- peak memory per mode: CUDA: the allocator's peak during the mode's blocks above what
  was allocated before them, plus the mode's own resident state (weights, optimizer
  state); CPU: the same from one profiled step per mode (the profiler's allocation
  events, `profile_memory=True`), since the CPU allocator keeps no peak counter.
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
import time
from typing import Any, Callable

import torch

from engine.analysis.speedup import (
    METHOD,
    MIN_ROUNDS,
    mode_labels,
    summarise,
    widest_half_width_pct,
)
from engine.analysis.drift import NOISE_SEED_OFFSET, loss_drift
from engine.config import RunConfig
from engine.training.input_pipeline import builtin_source
from engine.training.loop import Trainer, measure_flops_per_step, resolve_torch_device

WARMUP_STEPS_MIN = 2
BLOCK_TARGET_S = 0.25
BLOCK_STEPS_MIN = 2
BLOCK_STEPS_MAX = 200
MAX_ROUNDS = 400
ORDER_SEED_OFFSET = 7919  # the round order's draw: its own stream, apart from the data's


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _parameter_bytes(trainer: Trainer) -> int:
    return int(sum(p.numel() * p.element_size() for p in trainer.module.parameters()))


def _optimizer_state_bytes(trainer: Trainer) -> int:
    return int(sum(v.numel() * v.element_size() for state in trainer.optimizer.state.values()
                   for v in state.values() if isinstance(v, torch.Tensor)))


def _resident_bytes(trainer: Trainer) -> int:
    """Weights and optimizer state of one mode (gradients are freed after each step)."""
    return _parameter_bytes(trainer) + _optimizer_state_bytes(trainer)


def memory_by_kind(trainer: Trainer, peak_bytes: int | None) -> dict[str, Any] | None:
    """A mode's peak split by what holds it: parameters, optimizer state and gradients
    counted exactly from the model and the optimizer (a gradient per trainable parameter,
    in its dtype, all alive at the step's peak); no mode here keeps separate fp32 master
    copies (autocast computes from the fp32 weights, bf16-pure updates bf16 weights in
    place); the rest of the measured peak is activations, the autocast cast cache and
    kernel workspace."""
    if peak_bytes is None:
        return None
    params = _parameter_bytes(trainer)
    grads = int(sum(p.numel() * p.element_size() for p in trainer.params))
    state = _optimizer_state_bytes(trainer)
    counted = params + grads + state
    return {"parameters_bytes": params, "gradients_bytes": grads,
            "optimizer_state_bytes": state, "master_copies_bytes": 0,
            "rest_bytes": max(0, int(peak_bytes) - counted), "peak_bytes": int(peak_bytes),
            "counted_exceeds_peak": counted > peak_bytes}


class _Mode:
    def __init__(self, label: str, cfg: RunConfig, device: torch.device,
                 init_seed: int | None = None):
        self.label = label
        self.trainer = Trainer(cfg if init_seed is None else cfg.replace(seed=init_seed), device,
                               ledger=False)
        if init_seed is not None and self.trainer.workload is None:
            # The noise copy: another initialisation, the baseline's batches (the seed
            # also picks a built-in task's data and teacher)
            self.trainer.batches.close()
            self.trainer.batches = builtin_source(cfg, device)
        self.steps_done = 0
        self.block_ms: list[float] = []
        self.block_loss: list[float] = []  # mean loss of each timed block (same batches)
        self.last_block_loss = math.nan
        self.peak_increment_bytes = 0

    def run_steps(self, count: int, device: torch.device) -> float:
        """`count` optimizer steps; returns their wall time in seconds (device synced).
        The block's mean loss is summed on the device and read once, at the end."""
        _sync(device)
        start_s = time.perf_counter()
        total = None
        for _ in range(count):
            self.steps_done += 1
            loss, _ = self.trainer.step(self.steps_done, want_grad_norm=False)
            total = loss.float() if total is None else total + loss.float()
        if total is not None:
            # the last step's work is done before the clock stops
            self.last_block_loss = float(total.item()) / count
        _sync(device)
        return time.perf_counter() - start_s


def _cpu_step_peak_increment(mode: _Mode) -> int:
    """Peak bytes allocated above the start during one profiled step (CPU allocator)."""
    from torch.profiler import ProfilerActivity, profile  # only for this one step

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        mode.run_steps(1, torch.device("cpu"))
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
    return max([0, *totals])  # counted from 0 at the profiler's start


def _block_steps(modes: list[_Mode], device: torch.device) -> int:
    """Untimed calibration blocks per mode; the slowest mode sets the block length.

    Each mode's step time is the faster of two short blocks, so one slow step (a late
    allocation, a burst of other work) does not shrink every block of the check.
    """
    slowest_step_s = 0.0
    for mode in modes:
        step_s = min(mode.run_steps(BLOCK_STEPS_MIN, device) for _ in range(2)) / BLOCK_STEPS_MIN
        slowest_step_s = max(slowest_step_s, step_s)
    steps = math.ceil(BLOCK_TARGET_S / slowest_step_s) if slowest_step_s > 0 else BLOCK_STEPS_MAX
    return max(BLOCK_STEPS_MIN, min(BLOCK_STEPS_MAX, steps))


def measure_speedup(cfg: RunConfig, device_key: str,
                    on_progress: Callable[[dict[str, Any]], None] = lambda _p: None,
                    should_stop: Callable[[], bool] = lambda: False,
                    on_round: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Measure `cfg.speedup_modes` (the first is the baseline) against each other.

    `on_progress(result)` gets the result so far after every round; `on_round()` is called
    after every round too (the session marks contention there). Returns the result:
    baseline, modes (per mode: median_step_ms, samples_per_s, tokens_per_s, speedup,
    ci_low, ci_high, significant, peak_mem_bytes, blocks, words), rounds, block_steps,
    elapsed_s, budget_s, target_pct, widest_half_width_pct, stopped_by.
    """
    device = resolve_torch_device(device_key)
    modes_wanted = cfg.speedup_mode_list
    labels = mode_labels(modes_wanted)
    base_cfg = cfg.replace(speedup_modes="", profile=False, numerics=False)
    modes = [_Mode(label, base_cfg.replace(precision=mode), device)
             for label, mode in zip(labels, modes_wanted)]
    # The loss-drift noise floor: the baseline again from another initialisation, trained
    # on the same batches between the timed blocks; it never enters a speed figure.
    noise = _Mode(f"{labels[0]} (seed +{NOISE_SEED_OFFSET})", modes[0].trainer.cfg, device,
                  init_seed=cfg.seed + NOISE_SEED_OFFSET)
    warmup_steps = max(WARMUP_STEPS_MIN, cfg.warmup_steps)
    for mode in [*modes, noise]:
        mode.run_steps(warmup_steps, device)
    # Counted once per mode, so every mode's batch stream stays at the same step.
    flops = [measure_flops_per_step(mode.trainer) for mode in modes]
    flops_per_step = next((f for f in flops if f), None)
    block_steps = _block_steps(modes, device)
    memory_method = _measure_cpu_memory(modes) if device.type != "cuda" else "cuda"
    noise.run_steps(modes[0].steps_done - noise.steps_done, device)  # the same steps so far
    started_s = time.perf_counter()
    stopped_by = "budget"
    order_rng = random.Random(cfg.seed + ORDER_SEED_OFFSET)
    for round_index in range(MAX_ROUNDS):
        if should_stop():
            stopped_by = "stop requested"
            break
        # A fresh random order every round: a burst of other work lands on whichever mode
        # the draw put there, so it favours no mode (a fixed rotation let a periodic load
        # favour one position, and the interval then missed an A/A check's 1.0 too often).
        for mode in order_rng.sample(modes, len(modes)):
            _timed_block(mode, block_steps, device)
        noise.run_steps(block_steps, device)  # untimed, after the round's timed blocks
        noise.block_loss.append(noise.last_block_loss)
        on_round()
        elapsed_s = time.perf_counter() - started_s
        result = _result(cfg, labels, modes, block_steps, elapsed_s, memory_method,
                         flops_per_step, noise)
        width = result["widest_half_width_pct"]
        if round_index + 1 >= MIN_ROUNDS and width is not None and width <= cfg.speedup_target_pct:
            stopped_by = "target"
            break
        if elapsed_s >= cfg.speedup_budget_s:
            break
        on_progress(result)
    else:
        stopped_by = "round limit"
    result = _result(cfg, labels, modes, block_steps, time.perf_counter() - started_s,
                     memory_method, flops_per_step, noise)
    result["stopped_by"] = stopped_by
    return result


def _timed_block(mode: _Mode, block_steps: int, device: torch.device) -> None:
    if device.type == "cuda":
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    elapsed_s = mode.run_steps(block_steps, device)
    mode.block_ms.append(elapsed_s * 1000.0 / block_steps)
    mode.block_loss.append(mode.last_block_loss)
    if device.type == "cuda":
        increment = torch.cuda.max_memory_allocated(device) - before
        mode.peak_increment_bytes = max(mode.peak_increment_bytes, int(increment))


def _measure_cpu_memory(modes: list[_Mode]) -> str:
    for mode in modes:
        try:
            mode.peak_increment_bytes = _cpu_step_peak_increment(mode)
        except Exception:  # noqa: BLE001 - memory is reported as unknown, timing goes on
            mode.peak_increment_bytes = -1
    return "cpu profiler"


def _result(cfg: RunConfig, labels: list[str], modes: list[_Mode], block_steps: int,
            elapsed_s: float, memory_method: str, flops_per_step: float | None,
            noise: _Mode) -> dict[str, Any]:
    trainer = modes[0].trainer
    rows = summarise(labels, {m.label: m.block_ms for m in modes}, trainer.samples_per_step,
                     trainer.tokens_per_sample, labels[0])
    for row, mode in zip(rows, modes):
        row["drift"] = (None if mode is modes[0] else
                        loss_drift(modes[0].block_loss, mode.block_loss, noise.block_loss,
                                   mode.steps_done))
        row["peak_mem_bytes"] = (None if mode.peak_increment_bytes < 0
                                 else _resident_bytes(mode.trainer) + mode.peak_increment_bytes)
        row["memory_by_kind"] = memory_by_kind(mode.trainer, row["peak_mem_bytes"])
        row["achieved_flops_per_s"] = (flops_per_step * 1000.0 / row["median_step_ms"]
                                       if flops_per_step and row["median_step_ms"] else None)
    return {
        "baseline": labels[0], "modes": rows, "rounds": len(modes[0].block_ms),
        "block_steps": block_steps, "elapsed_s": elapsed_s, "budget_s": cfg.speedup_budget_s,
        "target_pct": cfg.speedup_target_pct,
        "widest_half_width_pct": widest_half_width_pct(rows, labels[0]),
        "memory_method": memory_method, "flops_per_step": flops_per_step,
        "block_ms": {m.label: [round(ms, 6) for ms in m.block_ms] for m in modes},
        "block_loss": {m.label: [round(loss, 6) for loss in m.block_loss]
                       for m in [*modes, noise]},
        "noise_copy": noise.label,
        "method": METHOD,
        "batch_size": cfg.batch_size, "model": f"{cfg.model}-{cfg.size}",
    }
