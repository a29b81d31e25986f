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

- the budget is wall time from the check's start, set-up included: building every copy,
  the FLOP count (one, before any step), warm-up (`warmup_steps`, at least
  WARMUP_STEPS_MIN untimed steps, each timed), two calibration blocks that set the block
  length (BLOCK_TARGET_S per block for the slowest mode, so switching costs are
  amortised, shortened so MIN_ROUNDS rounds fit what is left) and the CPU memory step,
  each reported as a set-up stage per mode; a mode whose warm-up shows its step cannot
  fit its set-up and MIN_ROUNDS rounds is left out, with the reason, before it costs more;
- stop: when every mode's 95 % interval is within `speedup_target_pct` of its speedup
  (after MIN_ROUNDS rounds), before a round that would end past the budget (its length:
  the last round's), or when a stop is requested;
- peak memory per mode: CUDA: the allocator's peak during the mode's blocks above what
  was allocated before them, plus the mode's own resident state (weights, optimizer
  state); CPU: the same from one profiled step per mode (the profiler's allocation
  events, `profile_memory=True`), since the CPU allocator keeps no peak counter.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Any

import torch

from engine.analysis.drift import loss_drift
from engine.analysis.speedup import (
    METHOD,
    MIN_ROUNDS,
    mode_labels,
    summarise,
    widest_half_width_pct,
)
from engine.config import RunConfig
from engine.training.input_pipeline import BatchSource
from engine.training.loop import Trainer, measure_flops_per_step, resolve_torch_device
from engine.training.memory import cpu_step_peak_increment, memory_by_kind, resident_bytes

WARMUP_STEPS_MIN = 2
BLOCK_TARGET_S = 0.25
BLOCK_STEPS_MIN = 2
BLOCK_STEPS_MAX = 200
MAX_ROUNDS = 400
ORDER_SEED_OFFSET = 7919  # the round order's draw: its own stream, apart from the data's
NOISE_ORDER_SEED_OFFSET = 1009  # the noise copy's batch order inside each block
AA_ORDER_SEED_OFFSET = 2029  # an A/A copy's batch order (+ its index): not the noise copy's


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _ReorderedBatches(BatchSource):
    """The same batches as the wrapped source, in another order inside each block: what
    the noise copy and an A/A copy train on during the timed rounds (`shuffle_next`
    before a block draws that block's batches and shuffles them with the copy's own
    seed; otherwise batches pass through in the stream's order)."""

    def __init__(self, source: BatchSource, order_seed: int):
        self.source = source
        self.rng = random.Random(order_seed)
        self.queue: list[tuple[Any, Any]] = []

    @property
    def wait_s(self) -> float:  # type: ignore[override]
        return self.source.wait_s

    def shuffle_next(self, count: int, first_step: int) -> None:
        batches = [self.source.next(first_step + index) for index in range(count)]
        self.rng.shuffle(batches)
        self.queue = batches

    def next(self, step: int) -> tuple[Any, Any]:
        return self.queue.pop() if self.queue else self.source.next(step)

    def close(self) -> None:
        self.source.close()


class _Mode:
    def __init__(self, label: str, cfg: RunConfig, device: torch.device,
                 order_seed: int | None = None):
        self.label = label
        self.trainer = Trainer(cfg, device, ledger=False)
        # A copy that trains on its block's batches in its own order once the timed rounds
        # begin (the noise copy, an A/A copy): the same weights and data, another path.
        self.reordered = None
        if order_seed is not None:
            self.reordered = _ReorderedBatches(self.trainer.batches, order_seed)
            self.trainer.batches = self.reordered
        self.reorder = False  # switched on at the first timed round
        self.steps_done = 0
        self.step_s = math.inf  # the fastest step seen in set-up (warm-up, calibration)
        self.block_ms: list[float] = []
        self.block_loss: list[float] = []  # mean loss of each timed block (same batches)
        self.last_block_loss = math.nan
        self.peak_increment_bytes = 0

    def run_steps(self, count: int, device: torch.device) -> float:
        """`count` optimizer steps; returns their wall time in seconds (device synced).
        The block's mean loss is summed on the device and read once, at the end."""
        _sync(device)
        start_s = time.perf_counter()
        if self.reorder and self.reordered is not None and count > 1:
            # inside the clock: the baseline draws its batches inside its block too
            self.reordered.shuffle_next(count, self.steps_done + 1)
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


def _calibrate(modes: list[_Mode], device: torch.device, setup: _Setup) -> None:
    """Two untimed calibration blocks per mode; each mode's step time is the fastest seen,
    so one slow step (a late allocation, a burst of other work) does not shrink every
    block of the check."""
    for mode in modes:
        setup.stage(mode.label, CALIBRATING)
        for _ in range(2):
            block_s = mode.run_steps(BLOCK_STEPS_MIN, device)
            mode.step_s = min(mode.step_s, block_s / BLOCK_STEPS_MIN)


def _block_steps(modes: list[_Mode], left_s: float) -> int:
    """The block length: BLOCK_TARGET_S for the slowest mode (switching costs amortised),
    shortened so that MIN_ROUNDS rounds (every mode and the noise copy) fit in `left_s`."""
    slowest_step_s = max(mode.step_s for mode in modes)
    steps = math.ceil(BLOCK_TARGET_S / slowest_step_s) if slowest_step_s > 0 else BLOCK_STEPS_MAX
    round_step_s = sum(mode.step_s for mode in modes) + modes[0].step_s  # + the noise copy
    if round_step_s > 0 and math.isfinite(round_step_s):
        steps = min(steps, math.floor(left_s / (MIN_ROUNDS * round_step_s)))
    return max(BLOCK_STEPS_MIN, min(BLOCK_STEPS_MAX, steps))


# The set-up stages, in order, as every surface names them.
BUILDING = "building"
WARMING_UP = "warming up"
COUNTING_FLOPS = "counting FLOPs"
CALIBRATING = "calibrating"
MEASURING_MEMORY = "measuring memory"
NOISE_COPY = "training the noise copy"
STAGE_DONE = {BUILDING: "built", COUNTING_FLOPS: "FLOPs counted", WARMING_UP: "warm",
              CALIBRATING: "calibrated", MEASURING_MEMORY: "memory measured",
              NOISE_COPY: "ready"}
SETUP_STAGES = (BUILDING, COUNTING_FLOPS, WARMING_UP, CALIBRATING, MEASURING_MEMORY, NOISE_COPY)
# What one mode's set-up still costs after its warm-up, in its own steps: two calibration
# blocks (4) and, on a CPU, the profiled memory step (~3 with the trace export); the noise
# copy then trains the baseline's set-up steps again. Used only to decide whether a mode
# can fit the budget.
SETUP_STEPS_AFTER_WARMUP = 7


class BudgetError(ValueError):
    """The budget cannot hold even the baseline's set-up and MIN_ROUNDS rounds."""


class _Setup:
    """The check's set-up phase: its clock (the budget counts from the check's start) and
    the progress every surface shows while no round has finished yet."""

    def __init__(self, labels: list[str], cfg: RunConfig, started_s: float,
                 on_setup: Callable[[dict[str, Any]], None]):
        self.cfg, self.started_s, self.on_setup = cfg, started_s, on_setup
        self.states = {label: "waiting" for label in labels}
        self.dropped: list[dict[str, Any]] = []
        self.stages_done = 0
        self.current: tuple[str, str] | None = None

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started_s

    def left_s(self) -> float:
        return self.cfg.speedup_budget_s - self.elapsed_s()

    def stage(self, label: str, stage: str) -> None:
        """`label` (a mode, or the noise copy) starts `stage`: the one before it is done."""
        if self.current:
            self.stages_done += 1
            before, stage_before = self.current
            if self.states.get(before) == stage_before:
                self.states[before] = STAGE_DONE[stage_before]
        self.current = (label, stage)
        if label in self.states:
            self.states[label] = stage
        self.report()

    def done(self, labels: list[str]) -> None:
        """The set-up is over: the kept modes are ready."""
        for label in labels:
            self.states[label] = "ready"
        self.stages_done += 1
        self.current = None
        self.report()

    def drop(self, label: str, reason: str) -> None:
        self.states[label] = "dropped"
        self.dropped.append({"mode": label, "reason": reason})
        self.report()

    def progress(self) -> dict[str, Any]:
        label, stage = self.current or (None, None)
        return {"phase": "setup", "stage": stage, "mode": label,
                "modes": dict(self.states), "stages_done": self.stages_done}

    def report(self) -> None:
        self.on_setup({"phase": "setup", "setup": self.progress(), "rounds": 0, "modes": [],
                       "elapsed_s": self.elapsed_s(), "budget_s": self.cfg.speedup_budget_s,
                       "target_pct": self.cfg.speedup_target_pct, "dropped": list(self.dropped),
                       "baseline": next(iter(self.states))})


def needed_s(step_times: list[float]) -> float:
    """Seconds the rest of the set-up and MIN_ROUNDS rounds need for modes whose steps take
    `step_times` seconds (the baseline first: it also trains the noise copy)."""
    per_step_of_each_s = sum(step_times) + step_times[0]
    return (SETUP_STEPS_AFTER_WARMUP + MIN_ROUNDS * BLOCK_STEPS_MIN) * per_step_of_each_s


def left_out_reason(label: str, step_s: float, need_s: float, left_s: float,
                    budget_s: float) -> str | None:
    """Why a mode is left out of the check (None: it fits what is left of the budget)."""
    if need_s <= left_s:
        return None
    return (f"{label} left out: one step takes {step_s:.2f} s, so its set-up and "
            f"{MIN_ROUNDS} rounds of {BLOCK_STEPS_MIN} steps need about {need_s:.0f} s with "
            f"the modes before it, and {max(0.0, left_s):.0f} s of the {budget_s:g} s budget "
            "were left; raise speedup_budget_s (--budget-s) to measure it")


def _warm_up(mode: _Mode, kept: list[_Mode], steps: int, device: torch.device,
             setup: _Setup) -> str | None:
    """`steps` untimed steps, each timed to learn the mode's step; None when the mode fits
    the budget, else why not (a mode left out early costs only the steps that showed it)."""
    setup.stage(mode.label, WARMING_UP)
    for index in range(steps):
        mode.step_s = min(mode.step_s, mode.run_steps(1, device))
        if index == 0 and steps > 1:
            continue  # the first step allocates and plans kernels: not the mode's speed
        need_s = needed_s([*(kept_mode.step_s for kept_mode in kept), mode.step_s])
        reason = left_out_reason(mode.label, mode.step_s, need_s, setup.left_s(),
                                 setup.cfg.speedup_budget_s)
        if reason:
            return reason
    return None


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


def _build(cfg: RunConfig, device: torch.device, setup: _Setup,
           should_stop: Callable[[], bool]) -> tuple[list[_Mode], _Mode, float | None]:
    """Every mode's copy, the noise copy and the FLOPs of one step."""
    labels = list(setup.states)
    base_cfg = cfg.replace(speedup_modes="", profile=False, numerics=False)
    baseline_mode = cfg.speedup_mode_list[0]
    modes: list[_Mode] = []
    for index, (label, mode) in enumerate(zip(labels, cfg.speedup_mode_list)):
        setup.stage(label, BUILDING)
        # An A/A copy (the baseline's mode again) trains the baseline's batches in its own
        # order during the rounds, like the noise copy: it then checks the drift's floor
        # as it checks the speed interval (a bit-identical copy drifts by exactly 0).
        aa_copy = index > 0 and mode == baseline_mode
        modes.append(_Mode(label, base_cfg.replace(precision=mode), device,
                           order_seed=cfg.seed + AA_ORDER_SEED_OFFSET + index if aa_copy
                           else None))
    # The drift's noise floor: the baseline again, from the same weights, trained on the
    # same batches in another order inside each block; it never enters a speed figure.
    noise_label = f"{labels[0]} (another batch order)"
    setup.stage(noise_label, BUILDING)
    noise = _Mode(noise_label, modes[0].trainer.cfg, device,
                  order_seed=cfg.seed + NOISE_ORDER_SEED_OFFSET)
    # The FLOPs of one step (the same model in every mode: one count, another mode's only
    # where the counter fails), before any step: the count keeps step 1's batch for step 1,
    # so no copy's batch stream moves.
    flops_per_step = None
    for mode in modes:
        setup.stage(mode.label, COUNTING_FLOPS)
        flops_per_step = measure_flops_per_step(mode.trainer)
        if flops_per_step or should_stop():
            break
    return modes, noise, flops_per_step


def _warm_up_all(cfg: RunConfig, modes: list[_Mode], device: torch.device, setup: _Setup,
                 should_stop: Callable[[], bool]) -> list[_Mode]:
    """Every mode warmed up; the modes kept (a mode too slow for the budget is left out,
    with the reason; the baseline too slow ends the check with it)."""
    warmup_steps = max(WARMUP_STEPS_MIN, cfg.warmup_steps)
    kept: list[_Mode] = []
    for mode in modes:
        if should_stop():
            break
        reason = _warm_up(mode, kept, warmup_steps, device, setup)
        if reason is None:
            kept.append(mode)
        elif mode is modes[0]:
            raise BudgetError(  # field, value, fix: the baseline cannot be left out
                f"speedup_budget_s {cfg.speedup_budget_s:g}: the baseline "
                + reason.replace(" left out:", ":", 1).replace(" to measure it", " to run "
                                                               "this check"))
        else:
            setup.drop(mode.label, reason)
            mode.trainer.close()
    left_out = {entry["mode"] for entry in setup.dropped}
    modes = [mode for mode in modes if mode.label not in left_out]  # a stop: the rest too
    if len(modes) < 2:
        raise BudgetError(f"speedup_budget_s {cfg.speedup_budget_s:g}: no mode but the "
                          "baseline fits the budget ("
                          + "; ".join(entry["reason"] for entry in setup.dropped) + ")")
    return modes


def measure_speedup(cfg: RunConfig, device_key: str,
                    on_progress: Callable[[dict[str, Any]], None] = lambda _p: None,
                    should_stop: Callable[[], bool] = lambda: False,
                    on_round: Callable[[], None] = lambda: None,
                    on_setup: Callable[[dict[str, Any]], None] = lambda _p: None,
                    started_s: float | None = None) -> dict[str, Any]:
    """Measure `cfg.speedup_modes` (the first is the baseline) against each other, within
    `cfg.speedup_budget_s` of wall time counted from `started_s` (time.perf_counter(),
    default now): the set-up (build, warm-up, FLOP count, calibration, memory step) is
    part of the budget, and a mode whose step cannot fit it is left out with the reason.

    `on_setup(progress)` gets the set-up's progress at every stage of every mode (phase
    "setup"); `on_progress(result)` the result so far after every round; `on_round()` is
    called after every round too (the session marks contention there). Returns the result:
    baseline, modes (per mode: median_step_ms, samples_per_s, tokens_per_s, speedup,
    ci_low, ci_high, significant, peak_mem_bytes, blocks, words, drift), rounds,
    block_steps, elapsed_s (set-up included), setup_s, budget_s, target_pct,
    widest_half_width_pct, dropped, stopped_by. Raises BudgetError when not even the
    baseline fits the budget.
    """
    started_s = time.perf_counter() if started_s is None else started_s
    device = resolve_torch_device(device_key)
    setup = _Setup(mode_labels(cfg.speedup_mode_list), cfg, started_s, on_setup)
    modes, noise, flops_per_step = _build(cfg, device, setup, should_stop)
    modes = _warm_up_all(cfg, modes, device, setup, should_stop)
    labels = [mode.label for mode in modes]
    if not should_stop():
        _calibrate(modes, device, setup)
    memory_method = "cuda"
    if device.type != "cuda" and not should_stop():
        memory_method = _measure_cpu_memory(modes, setup)
    if not should_stop():
        setup.stage(noise.label, NOISE_COPY)
        # the noise copy trains the baseline's steps so far, in order: the same weights
        noise.run_steps(modes[0].steps_done - noise.steps_done, device)
    setup.done(labels)
    for copy in [*modes, noise]:
        copy.reorder = True
    setup_s = setup.elapsed_s()
    block_steps = _block_steps(modes, setup.left_s())
    stopped_by = "budget"
    order_rng = random.Random(cfg.seed + ORDER_SEED_OFFSET)
    round_s = 0.0
    for round_index in range(MAX_ROUNDS):
        if should_stop():
            stopped_by = "stop requested"
            break
        # The budget is the wall time the check takes: a round that would end past it
        # does not start (its length: the last round's).
        if setup.left_s() < round_s:
            break
        round_started_s = time.perf_counter()
        # A fresh random order every round: a burst of other work lands on whichever mode
        # the draw put there, so it favours no mode (a fixed rotation let a periodic load
        # favour one position, and the interval then missed an A/A check's 1.0 too often).
        for mode in order_rng.sample(modes, len(modes)):
            _timed_block(mode, block_steps, device)
        noise.run_steps(block_steps, device)  # untimed, after the round's timed blocks
        noise.block_loss.append(noise.last_block_loss)
        round_s = time.perf_counter() - round_started_s
        on_round()
        result = _result(cfg, labels, modes, block_steps, setup, memory_method,
                         flops_per_step, noise, setup_s)
        width = result["widest_half_width_pct"]
        if round_index + 1 >= MIN_ROUNDS and width is not None and width <= cfg.speedup_target_pct:
            stopped_by = "target"
            break
        on_progress(result)
    else:
        stopped_by = "round limit"
    result = _result(cfg, labels, modes, block_steps, setup, memory_method, flops_per_step,
                     noise, setup_s)
    result["stopped_by"] = stopped_by
    return result


def _measure_cpu_memory(modes: list[_Mode], setup: _Setup) -> str:
    for mode in modes:
        setup.stage(mode.label, MEASURING_MEMORY)
        try:
            mode.peak_increment_bytes = cpu_step_peak_increment(
                lambda: mode.run_steps(1, torch.device("cpu")))
        except Exception:  # noqa: BLE001 - memory is reported as unknown, timing goes on
            mode.peak_increment_bytes = -1
    return "cpu profiler"


def _result(cfg: RunConfig, labels: list[str], modes: list[_Mode], block_steps: int,
            setup: _Setup, memory_method: str, flops_per_step: float | None,
            noise: _Mode, setup_s: float) -> dict[str, Any]:
    trainer = modes[0].trainer
    rows = summarise(labels, {m.label: m.block_ms for m in modes}, trainer.samples_per_step,
                     trainer.tokens_per_sample, labels[0])
    for row, mode in zip(rows, modes):
        row["drift"] = (None if mode is modes[0] else
                        loss_drift(modes[0].block_loss, mode.block_loss, noise.block_loss,
                                   mode.steps_done))
        row["peak_mem_bytes"] = (None if mode.peak_increment_bytes < 0
                                 else resident_bytes(mode.trainer) + mode.peak_increment_bytes)
        row["memory_by_kind"] = memory_by_kind(mode.trainer, row["peak_mem_bytes"])
        row["achieved_flops_per_s"] = (flops_per_step * 1000.0 / row["median_step_ms"]
                                       if flops_per_step and row["median_step_ms"] else None)
    return {
        "baseline": labels[0], "modes": rows, "rounds": len(modes[0].block_ms),
        "block_steps": block_steps, "elapsed_s": setup.elapsed_s(), "setup_s": setup_s,
        "budget_s": cfg.speedup_budget_s, "phase": "rounds", "dropped": list(setup.dropped),
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
