"""`python -m engine speedup`: the paired speedup check, headless.

The check is a run like any other (queued for the device, stoppable, listed, kept in the
store), whose trainer measures 2-4 modes interleaved (engine.training.speedup) instead of
training one. The same stored result is what Live, Compare and the HTML report show.
Progress (rounds, the widest interval) goes to stderr; with --json the last stdout line
is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from engine.analysis.gate import (
    MEMORY,
    SPEED,
    Requirement,
    RequirementError,
    check_modes,
    gate,
    gate_lines,
    parse_requirement,
)
from engine.analysis.speedup import CLAIMS, excludes_one, judge, mode_labels, setup_words
from engine.cli.errors import EXIT_OK, EXIT_RUN_FAILED, UsageError, shown, typed
from engine.cli.runs import _add_config_options, _launch_checked, config_from_args
from engine.config import Precision
from engine.display import (
    interval_text,
    memory_text,
    memory_unit,
    ratio_text,
    step_time_text,
    throughput_text,
)
from engine.run.launcher import reconcile, stop
from engine.schema import FINAL_STATUSES, FINISHED
from engine.store import Store


def add_subparsers(sub) -> None:
    parser = sub.add_parser(
        "speedup", help="paired speedup check: 2-4 precision modes interleaved in one "
                        "process, speedups with 95 % intervals")
    parser.add_argument("--precisions", default=None, metavar="MODE,MODE[,...]",
                        help="the modes to compare, baseline first (e.g. fp32,bf16-amp,fp16-amp); "
                             "a mode twice is an A/A check of the method")
    parser.add_argument("--budget-s", dest="budget_s", type=typed(float, "--budget-s"),
                        default=None, help="the check's wall time in seconds, set-up (warm-up, "
                                           "calibration, memory step) included; a mode whose "
                                           "step cannot fit it is left out (default 120)")
    parser.add_argument("--target-pct", dest="target_pct", type=typed(float, "--target-pct"),
                        default=None, help="stop once every interval is within this %% of its "
                                           "speedup (default 3)")
    parser.add_argument("--require", action="append", default=[], metavar="MODE>=RATIO",
                        help="a CI gate: exit 0 only if the 95 %% interval's lower end of MODE's "
                             "speedup clears RATIO (e.g. 'bf16-amp>=1.3'), 1 if the whole "
                             "interval misses it, 3 if inconclusive (busy, too wide); repeatable")
    parser.add_argument("--require-mem", action="append", default=[], metavar="MODE<=RATIO",
                        help="a CI gate on the tensor peak over the baseline's (e.g. "
                             "'bf16-amp<=0.8'); repeatable")
    _add_config_options(parser)
    parser.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    parser.set_defaults(func=cmd_speedup, from_run=None)


def speedup_config(args: argparse.Namespace):
    """The check's RunConfig: --precisions (or --speedup-modes), the baseline as precision."""
    if args.precisions is not None and args.speedup_modes is not None:
        raise UsageError(f"--precisions {shown(args.precisions)}: give the modes once, with "
                         "--precisions or --speedup-modes")
    for short, long in (("budget_s", "speedup_budget_s"), ("target_pct", "speedup_target_pct")):
        if getattr(args, short) is not None and getattr(args, long) is not None:
            raise UsageError(f"--{long.replace('_', '-')} {getattr(args, long):g}: give it once, "
                             f"with --{short.replace('_', '-')} or --{long.replace('_', '-')}")
    modes = args.precisions if args.precisions is not None else args.speedup_modes
    given_as = "--speedup-modes" if args.speedup_modes is not None else "--precisions"
    if not (modes or "").replace(",", "").strip():
        raise UsageError(f"{given_as}{' ' + shown(modes) if modes is not None else ''}: "
                         "missing; give 2-4 modes, baseline first, e.g. "
                         "--precisions fp32,bf16-amp")
    known = [mode.value for mode in Precision]
    unknown = [mode.strip() for mode in modes.split(",")
               if mode.strip() and mode.strip() not in known]  # empty ones: the config's rule
    if unknown:  # before the first mode becomes the baseline's --precision
        raise UsageError(f"{given_as} {shown(modes)}: unknown mode {shown(unknown[0])}; give "
                         f"2-4 of {', '.join(known)}, baseline first, e.g. fp32,bf16-amp")
    args.speedup_modes = modes
    first = next(mode.strip() for mode in modes.split(",") if mode.strip())
    if args.precision is not None and args.precision != first:
        raise UsageError(f"--precision {shown(args.precision)}: a speedup check's baseline is the "
                         f"first of --precisions ({shown(first)}); leave --precision out")
    args.precision = first
    if args.budget_s is not None:
        args.speedup_budget_s = args.budget_s
    if args.target_pct is not None:
        args.speedup_target_pct = args.target_pct
    try:
        return config_from_args(args)
    except UsageError as exc:
        raise _as_typed(exc, args) from None


def _as_typed(exc: UsageError, args: argparse.Namespace) -> UsageError:
    """The error naming the flag the user typed: the config names its fields' own flags
    (--speedup-modes for --precisions, --speedup-budget-s for --budget-s)."""
    typed_as = {"--speedup-modes": "--precisions" if args.precisions is not None
                else "--speedup-modes"}
    if args.budget_s is not None:
        typed_as["--speedup-budget-s"] = "--budget-s"
    if args.target_pct is not None:
        typed_as["--speedup-target-pct"] = "--target-pct"
    flag, _, rest = str(exc).partition(" ")
    return UsageError(f"{typed_as[flag]} {rest}") if flag in typed_as else exc


def requirements_of(args: argparse.Namespace, labels: list[str]) -> list[Requirement]:
    """The gate's requirements, read and checked against the check's modes before it runs."""
    try:
        requirements = ([parse_requirement(text, SPEED) for text in args.require]
                        + [parse_requirement(text, MEMORY) for text in args.require_mem])
        check_modes(requirements, labels)
    except RequirementError as exc:
        raise UsageError(str(exc)) from None
    return requirements


def cmd_speedup(args: argparse.Namespace) -> int:
    cfg = speedup_config(args)
    requirements = requirements_of(args, mode_labels(cfg.speedup_mode_list))
    store = Store()
    try:
        run_id = _launch_checked(cfg, store)
    except UsageError as exc:
        raise _as_typed(exc, args) from None
    print(f"speedup check {run_id}: {', '.join(cfg.speedup_mode_list)} on {cfg.model_label} "
          f"bs{cfg.batch_size}, budget {cfg.speedup_budget_s:g} s", file=sys.stderr)
    try:
        run = _follow(run_id, store)
    except KeyboardInterrupt:
        print(f"\nstopping speedup check {run_id} ...", file=sys.stderr)
        run = stop(run_id, store)
    result = check_result(run_id, store)
    if requirements and run.status == FINISHED:
        result["gate"] = gate(requirements, result)
        print("\n".join(gate_lines(result["gate"])), file=sys.stderr)
    print(json.dumps(result) if args.json else format_result(result))
    if run.status != FINISHED:
        return EXIT_RUN_FAILED
    return result["gate"]["exit_code"] if requirements else EXIT_OK


def _follow(run_id: str, store: Store):
    last_rounds, last_reconcile = None, time.monotonic()
    while True:
        run = store.get_run(run_id)
        progress = run.summary.get("speedup") or {}
        # a round finished, or a set-up stage: each is a line
        moved = (progress.get("rounds", -1), (progress.get("setup") or {}).get("stages_done"),
                 (progress.get("setup") or {}).get("stage"))
        if moved != last_rounds and progress:
            last_rounds = moved
            print(f"  {progress_line(progress)}", file=sys.stderr)
        if run.status in FINAL_STATUSES:
            return run
        if time.monotonic() - last_reconcile > 2.0:
            reconcile(store)
            last_reconcile = time.monotonic()
        time.sleep(0.3)


def progress_line(progress: dict[str, Any]) -> str:
    setup = setup_words(progress)
    if setup:
        return f"set-up: {setup}"
    done = min(1.0, progress["elapsed_s"] / progress["budget_s"]) if progress.get("budget_s") else 0
    bar = "#" * int(done * 20)
    width = progress.get("widest_half_width_pct")
    parts = [f"[{bar:<20}] round {progress['rounds']}",
             f"{progress['elapsed_s']:.0f}/{progress['budget_s']:.0f} s"]
    if width is not None:
        parts.append(f"widest interval +/-{width:.1f} % (target {progress['target_pct']:g} %)")
    for row in progress.get("modes", [])[1:]:
        if row.get("ci_low") is not None:
            parts.append(f"{row['mode']} {row['speedup']:.2f}x "
                         f"[{row['ci_low']:.2f}-{row['ci_high']:.2f}]")
    return ", ".join(parts)


def check_result(run_id: str, store: Store) -> dict[str, Any]:
    """The stored result as the CLI prints it: `modes` is a list, baseline first, each
    row naming its `mode` (the shape `show --json` and the stored summary have)."""
    run = store.get_run(run_id)
    result = run.summary.get("speedup") or {}
    modes = []
    judged = {**result, "contention": run.summary.get("contention") or result.get("contention")}
    for row in result.get("modes", []):
        entry = {key: row.get(key) for key in (
            "mode", "median_step_ms", "samples_per_s", "tokens_per_s", "speedup", "ci_low",
            "ci_high", "coverage", "peak_mem_bytes", "memory_by_kind", "blocks", "drift")}
        entry["tensor_peak_bytes"] = row.get("peak_mem_bytes")  # a check's peak: tensors
        # One rule for every surface: a busy check claims nothing (verdict inconclusive).
        verdict = judge(row, judged)  # verdict, verdict_reason, words
        entry.update(verdict, significant=verdict["verdict"] in CLAIMS,
                     interval_excludes_1=row["mode"] != result.get("baseline")
                     and excludes_one(row))
        modes.append(entry)
    return {"run_id": run.id, "status": run.status, "reason": run.reason,
            "baseline": result.get("baseline"), "modes": modes,
            "rounds": result.get("rounds"), "block_steps": result.get("block_steps"),
            "elapsed_s": result.get("elapsed_s"), "setup_s": result.get("setup_s"),
            "budget_s": result.get("budget_s"), "dropped": result.get("dropped") or [],
            "stopped_by": result.get("stopped_by"),
            "memory_method": result.get("memory_method"),
            "contention": run.summary.get("contention") or result.get("contention"),
            "device": run.device_key, "device_name": run.device_name,
            "model": run.config.model_label, "batch_size": run.config.batch_size,
            "noise_copy": result.get("noise_copy"), "findings": result.get("findings") or []}


def format_result(result: dict[str, Any]) -> str:
    lines = [f"speedup check {result['run_id']}: {result['status']}"
             + (f" ({result['reason']})" if result.get("reason") else "")]
    contention = result.get("contention") or {}
    if contention.get("words"):
        lines.append(f"  {contention['words']}")
    rows = result["modes"]
    unit = memory_unit(row.get("peak_mem_bytes") for row in rows)  # one unit for the column
    lines.append(f"  {'mode':<14} {'median step':>12} {'samples/s':>11} {'speedup':>9} "
                 f"{'95 % CI':>13} {'tensor peak ' + unit:>16}  verdict")
    for row in rows:
        label = row["mode"]
        # the digits of Live, Compare and the report (engine.display); n/a, never 0.00
        step = step_time_text(row.get("median_step_ms"))
        ci = interval_text(row.get("ci_low"), row.get("ci_high")) or "-"
        mem = memory_text(row.get("peak_mem_bytes"), unit, with_unit=False)
        lines.append(f"  {label:<14} {step:>12} {throughput_text(row.get('samples_per_s')):>11} "
                     f"{ratio_text(row.get('speedup')):>9} {ci:>13} {mem:>16}  "
                     f"{row.get('words') or ''}")
    for finding in result.get("findings") or []:
        if finding != contention.get("words"):  # said above already
            lines.append(f"  - {finding}")
    return "\n".join(lines)
