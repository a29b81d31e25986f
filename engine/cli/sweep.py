"""`python -m engine sweep create|list|show|stop`: sweeps, headless.

Registered by cli._add_optional_commands. Bad input exits 2 with one line naming the
flag, the value and the fix; `--json` makes the last stdout line one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from engine.cli.errors import EXIT_OK, EXIT_RUN_FAILED, UsageError, shown, typed
from engine.cluster.ray_env import RAY_ADDRESS_ENV, RayOptions, default_ray_address
from engine.cluster.sweep import (
    MATRIX_METRICS,
    SweepGrid,
    counts_text,
    create_sweep,
    matrix_text,
    results_matrix,
    stop_sweep,
    sweep_view,
    wait_sweep,
)
from engine.config import ConfigError, ModelName, ModelSize, Precision, choices
from engine.run.launcher import reconcile
from engine.schema import FINISHED
from engine.store import Store, SweepNotFound, validate_run_id

# SweepGrid / RayOptions field -> the flag a user typed.
_FLAGS = {
    "models": "--models", "precisions": "--precisions", "precision": "--precisions",
    "batch_sizes": "--batch-sizes", "batch_size": "--batch-sizes", "size": "--size",
    "steps": "--steps", "device": "--device", "ray_address": "--ray-address",
    "workload": "--workload",
    "grid": "--models x --precisions x --batch-sizes", "gpus_per_run": "--gpus-per-run",
    "cpus_per_run": "--cpus-per-run", "stop_grace_s": "--stop-grace-s", "metric": "--metric",
    "connect_timeout_s": "--connect-timeout-s",
}


def add_subparsers(sub) -> None:
    sweep = sub.add_parser("sweep", help="grids of runs (models x precisions x batch sizes), "
                                         "locally or on a Ray cluster")
    commands = sweep.add_subparsers(dest="sweep_command", required=True,
                                    metavar="{create,list,show,stop}")
    _add_create(commands)

    listing = commands.add_parser("list", help="all sweeps, newest first")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_list)

    show = commands.add_parser("show", help="each run's status and the results matrix")
    show.add_argument("sweep_id", metavar="SWEEP_ID")
    _add_metric(show)
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_show)

    stop = commands.add_parser("stop", help="stop every queued or running run of a sweep")
    stop.add_argument("sweep_id", metavar="SWEEP_ID")
    stop.add_argument("--json", action="store_true")
    stop.set_defaults(func=cmd_stop)


def _add_create(commands) -> None:
    create = commands.add_parser(
        "create", help="start a sweep: every combination of the lists below",
        description="Every combination of --models x --precisions x --batch-sizes becomes one "
                    f"run. Runs go to this machine's device queue, or to a Ray cluster with "
                    f"--ray-address (default: ${RAY_ADDRESS_ENV}).")
    create.add_argument("--models", default="mlp",
                        help=f"comma-separated; choices: {', '.join(choices(ModelName))}")
    create.add_argument("--precisions", default="fp32",
                        help=f"comma-separated; choices: {', '.join(choices(Precision))}")
    create.add_argument("--batch-sizes", default="16", help="comma-separated, e.g. 8,16,32")
    create.add_argument("--size", default="tiny",
                        help=f"model size for every run; choices: {', '.join(choices(ModelSize))}")
    create.add_argument("--workload", default="", metavar="PATH.py|MODULE:FUNCTION",
                        help="the workload of the custom model, when --models has custom "
                             "(docs/workloads.md)")
    create.add_argument("--steps", type=_int("--steps"), default=30,
                        help="optimizer steps per run (default 30)")
    create.add_argument("--device", default="auto",
                        help="local sweeps: auto | cpu | cuda | cuda:N (Ray places runs itself)")
    create.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True,
                        help="profile a few steps per run (kernel breakdown); default on")
    where = create.add_mutually_exclusive_group()
    where.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                       help=f"run on this Ray cluster (or 'auto'); default ${RAY_ADDRESS_ENV}")
    where.add_argument("--local", action="store_true",
                       help=f"run on this machine even if ${RAY_ADDRESS_ENV} is set")
    create.add_argument("--gpus-per-run", type=_int("--gpus-per-run"), default=1,
                        help="Ray: GPUs each run reserves (CPU-only clusters: ignored)")
    create.add_argument("--cpus-per-run", type=_int("--cpus-per-run"), default=1,
                        help="Ray: CPUs each run reserves")
    create.add_argument("--stop-grace-s", type=_float("--stop-grace-s"), default=None,
                        help="Ray: seconds a stopped run may take before its task is "
                             "force-cancelled (default 5)")
    create.add_argument("--connect-timeout-s", type=_float("--connect-timeout-s"), default=None,
                        help="Ray: seconds to wait for the cluster to answer (default 60)")
    create.add_argument("--wait", action="store_true",
                        help="wait until every run has ended, then print `show`")
    create.add_argument("--timeout-s", type=_float("--timeout-s"), default=3600.0,
                        help="with --wait: give up waiting after this long (default 3600)")
    _add_metric(create)
    create.add_argument("--json", action="store_true")
    create.set_defaults(func=cmd_create)


def _add_metric(parser) -> None:
    parser.add_argument("--metric", default="throughput_x",
                        help=f"results matrix metric: {', '.join(MATRIX_METRICS)}")


def _int(flag: str):
    return typed(int, flag)


def _float(flag: str, low: float = 0.0):
    """Seconds: a plain finite number >= `low`."""
    parse = typed(float, flag)

    def convert(text: str) -> float:
        value = parse(text)
        if not math.isfinite(value) or value < low:
            raise argparse.ArgumentTypeError(f"{flag} {shown(text)}: expected seconds >= "
                                             f"{low:g}, e.g. 60")
        return value
    convert.__name__ = "float"
    return convert


def _usage(exc: ConfigError) -> UsageError:
    flag = _FLAGS.get(exc.field, "--" + exc.field.replace("_", "-"))
    return UsageError(f"{flag} {shown(exc.value)}: {exc.fix}")


# ---------------------------------------------------------------------------------------
# commands


def cmd_create(args: argparse.Namespace) -> int:
    address = "" if args.local else (args.ray_address if args.ray_address is not None
                                     else default_ray_address())
    _check_metric(args.metric)
    try:
        grid = SweepGrid(models=args.models, precisions=args.precisions,
                         batch_sizes=args.batch_sizes, size=args.size, steps=args.steps,
                         device=args.device, profile=args.profile,
                         workload=_workload_path(args.workload))
        timing = {name: getattr(args, name) for name in ("stop_grace_s", "connect_timeout_s")
                  if getattr(args, name) is not None}
        options = RayOptions(gpus_per_run=args.gpus_per_run, cpus_per_run=args.cpus_per_run,
                             **timing)
        store = Store()
        sweep_id = create_sweep(grid, store, ray_address=address, ray_options=options)
    except ConfigError as exc:
        raise _usage(exc) from None
    if not args.wait:
        view = sweep_view(store, sweep_id)
        if args.json:
            print(json.dumps({"sweep_id": sweep_id, "backend": view.sweep.backend,
                              "run_ids": view.sweep.run_ids}))
        else:
            print(f"sweep {sweep_id}: {len(view.runs)} runs "
                  f"({_where(view.sweep)}); `python -m engine sweep show {sweep_id}`")
        return EXIT_OK
    view = wait_sweep(store, sweep_id, timeout_s=args.timeout_s)
    _print_view(view, args.metric, args.json)
    return EXIT_OK if all(r.status == FINISHED for r in view.runs) else EXIT_RUN_FAILED


def cmd_list(args: argparse.Namespace) -> int:
    store = Store()
    reconcile(store)
    views = [sweep_view(store, sweep.id) for sweep in store.list_sweeps()]
    if args.json:
        print(json.dumps([_view_summary(view) for view in views]))
        return EXIT_OK
    print(f"{'sweep_id':<30} {'status':<8} {'where':<28} {'runs'}")
    for view in views:
        print(f"{view.sweep.id:<30} {view.status:<8} {_where(view.sweep):<28} "
              f"{len(view.runs)}: {counts_text(view.counts)}")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    _check_metric(args.metric)
    store = Store()
    reconcile(store)
    _print_view(sweep_view(store, _sweep_id(args.sweep_id, store)), args.metric, args.json)
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    store = Store()
    runs = stop_sweep(_sweep_id(args.sweep_id, store), store)
    if args.json:
        print(json.dumps({"sweep_id": args.sweep_id,
                          "runs": [{"run_id": r.id, "status": r.status, "reason": r.reason}
                                   for r in runs]}))
    else:
        for run in runs:
            print(f"run {run.id}: {run.status}" + (f" ({run.reason})" if run.reason else ""))
    return EXIT_OK


# ---------------------------------------------------------------------------------------
# output


def _check_metric(metric: str) -> None:
    if metric not in MATRIX_METRICS:
        raise UsageError(f"--metric {metric!r}: unknown metric; choose one of "
                         f"{', '.join(MATRIX_METRICS)}")


def _sweep_id(text: str, store: Store) -> str:
    try:
        validate_run_id(text)
        return store.get_sweep(text).id
    except ValueError:
        raise UsageError(f"SWEEP_ID {text!r}: not a valid sweep id (letters, digits, - and _); "
                         "`python -m engine sweep list` shows the sweeps") from None
    except SweepNotFound as exc:
        raise UsageError(f"SWEEP_ID {text!r}: no such sweep; `python -m engine sweep list` "
                         "shows the sweeps") from exc


def _where(sweep) -> str:
    return f"ray {sweep.ray_address}" if sweep.backend == "ray" else "local"


def _view_summary(view) -> dict:
    return {"sweep_id": view.sweep.id, "status": view.status, "backend": view.sweep.backend,
            "ray_address": view.sweep.ray_address, "reason": view.sweep.reason,
            "created_at": view.sweep.created_at, "grid": view.grid.to_dict(),
            "run_counts": view.counts, "run_ids": view.sweep.run_ids}


def _print_view(view, metric: str, as_json: bool) -> None:
    matrix = results_matrix(view, metric)
    if as_json:
        info = _view_summary(view)
        info["runs"] = [{"run_id": r.id, "status": r.status, "reason": r.reason,
                         "model": r.config.model, "precision": r.config.precision,
                         "batch_size": r.config.batch_size, "device": r.device_key,
                         "steps_completed": r.steps_completed, "total_steps": r.total_steps}
                        for r in view.runs]
        info["matrix"] = {"metric": metric, "baseline": matrix["baseline"], "values": {
            model: {precision: {str(batch): _json_number(frame.loc[precision, batch])
                                for batch in frame.columns} for precision in frame.index}
            for model, frame in matrix["values"].items()}}
        print(json.dumps(info))
        return
    sweep = view.sweep
    print(f"sweep {sweep.id}  {_where(sweep)}  {view.status}  created "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(sweep.created_at))}")
    if sweep.reason:
        print(f"reason: {sweep.reason}")
    print(f"\n{'run_id':<24} {'model':<12} {'precision':<10} {'batch':>6} {'status':<9} "
          f"{'steps':>9}  device")
    for r in view.runs:
        print(f"{r.id:<24} {r.config.model + '-' + r.config.size:<12} {r.config.precision:<10} "
              f"{r.config.batch_size:>6} {r.status:<9} "
              f"{str(r.steps_completed) + '/' + str(r.total_steps):>9}  {r.device_key}"
              + (f"  ({r.reason})" if r.reason and r.status != FINISHED else ""))
    print()
    print(matrix_text(matrix))
    sys.stdout.flush()


def _json_number(value) -> float | None:
    return float(value) if isinstance(value, float) and math.isfinite(value) else None


def _workload_path(text: str) -> str:
    """A workload file as an absolute path: the runs' trainers start in the project root."""
    if text.strip().endswith(".py"):
        return str(Path(text.strip()).expanduser().resolve())
    return text
