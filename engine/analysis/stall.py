"""One rule for "this run has made no progress for a while", for every surface: the
supervisor's log line (engine.run.watch), Live's warning and `engine show`.

Progress is a logged step, a finished round of a speedup check or a finished stage of its
set-up. While a check is in its set-up (building, warming up, calibrating each mode: one
stage of a large model can take minutes on a CPU) the bound is the check's whole budget
(which the set-up spends) plus the usual bound: a stage silent for longer is stalled, a shorter
one is the check at work and every surface says which stage of which mode it is in
(engine.analysis.speedup.setup_words). A run whose supervisor
watches it (single-process and torchrun runs) has `stall` in its summary: None while it
makes progress, else since when and at which step it has been silent, judged by the
supervisor's own clock, before the first step too (a build() that never returns). A run
nobody watches here (a Ray task, a run recorded before the watch existed) is judged from
its last metric row instead. No pandas here: the supervisor imports it.
"""

from __future__ import annotations

import time
from typing import Any

from engine.config import env_number

STALL_ENV = "PRECISION_LAB_STALL_WARN_S"
DEFAULT_STALL_WARN_S = 60.0
STALL_WARN_RANGE_S = (5.0, 86_400.0)


def stall_warn_s() -> tuple[float, str | None]:
    """The bound in seconds ($PRECISION_LAB_STALL_WARN_S, default 60), and why a value
    given was not used (the supervisor says it in the run's log)."""
    return env_number(STALL_ENV, DEFAULT_STALL_WARN_S, *STALL_WARN_RANGE_S, "seconds")


def speedup_in_setup(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """A running speedup check's stored progress while it is in its set-up, else None."""
    speedup = (summary or {}).get("speedup") or {}
    return speedup if speedup.get("phase") == "setup" and speedup.get("running") else None


def stall_bound_s(summary: dict[str, Any] | None, default_s: float) -> float:
    """The no-progress bound for this run now: a speedup check in set-up gets its whole
    budget (the set-up is part of it) plus `default_s` (the trainer's own start comes
    before the check's clock), everything else `default_s`."""
    setup = speedup_in_setup(summary)
    budget_s = setup.get("budget_s") if setup else None
    return default_s + float(budget_s) if isinstance(budget_s, (int, float)) else default_s


def stall_of(store, run, now_s: float | None = None) -> dict[str, Any] | None:
    """The run's stall ({"since_unix_s", "at_step"}) when it is running and has made no
    progress for the bound, else None."""
    if run.status != "running" or run.started_at is None:
        return None
    summary = run.summary or {}
    if "stall" in summary:  # the supervisor watches this run: its judgement
        stall = summary["stall"] or None
        if stall and speedup_in_setup(summary) and not stall.get("setup"):
            return None  # recorded before the set-up said where it is: the stage leads
        return stall
    last = store.last_metric(run.id)
    wall_s = last.get("wall_time_s") if last else None
    since_s = run.started_at + (float(wall_s) if isinstance(wall_s, (int, float)) else 0.0)
    now_s = time.time() if now_s is None else now_s
    if now_s - since_s <= stall_bound_s(summary, stall_warn_s()[0]):
        return None
    return {"since_unix_s": since_s, "at_step": run.steps_completed}


def silent_s(stall: dict[str, Any] | None, now_s: float | None = None) -> float | None:
    """Seconds without progress for a stall from stall_of; None for no stall."""
    if not stall:
        return None
    return max(0.0, (time.time() if now_s is None else now_s) - float(stall["since_unix_s"]))


def stall_words(stall: dict[str, Any], now_s: float | None = None) -> str:
    """The sentence every surface says for a stall."""
    quiet = duration_words(silent_s(stall, now_s) or 0.0)
    step, rounds = int(stall.get("at_step") or 0), int(stall.get("at_round") or 0)
    setup = stall.get("setup")
    if setup:  # a speedup check's set-up stage, silent for longer than the whole budget
        return (f"No progress for {quiet}: the speedup check is still {setup.get('stage')} "
                f"{setup.get('mode')}, longer than its whole budget (a hung device, or a "
                "model too large for this budget).")
    if rounds:  # a speedup check: its rounds are its progress
        return (f"No progress for {quiet}: no round finished since round {rounds} (paused, a "
                "hung device, or a very slow block).")
    if step == 0:
        return (f"No step yet, {quiet} after the trainer started: the workload's build() "
                "(model and data set-up) or the first step has not returned.")
    return (f"No progress for {quiet}: no step logged since step {step} (paused, a hung "
            "device, or a very slow step).")


def duration_words(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"
