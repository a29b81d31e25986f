"""`python -m engine export RUN_ID [RUN_ID ...]` with one destination:

    --html PATH          a self-contained HTML report of the runs
    --csv PATH           one run's metrics, every column, units in the header
    --parquet PATH       the same as Parquet (units in the file metadata)
    --mlflow URI         each run as an MLflow run (e.g. file:/path/mlruns; optional extra)
    --tensorboard DIR    each run as TensorBoard event files under DIR (optional extra)

Registered by engine.cli.main (it calls `add_subparsers`). Bad input exits 2 with one
line naming the field.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from urllib.parse import urlparse

from engine.cli.errors import EXIT_OK, UsageError, checked_path_text, shown, typed
from engine.store import RunNotFound, Store, validate_run_id


def add_subparsers(sub) -> None:
    export = sub.add_parser(
        "export", help="write a self-contained HTML report of one or more runs")
    export.add_argument("run_ids", nargs="+", metavar="RUN_ID",
                        help="runs to report (`python -m engine list` shows them)")
    where = export.add_mutually_exclusive_group(required=True)
    where.add_argument("--html", metavar="PATH",
                       help="HTML report to write; opens offline (plotly.js is embedded)")
    where.add_argument("--csv", metavar="PATH", help="one run's metrics as CSV")
    where.add_argument("--parquet", metavar="PATH", help="one run's metrics as Parquet")
    where.add_argument("--mlflow", metavar="TRACKING_URI",
                       help="MLflow tracking URI, e.g. file:/data/mlruns or http://host:5000")
    where.add_argument("--tensorboard", metavar="DIR",
                       help="log directory for TensorBoard event files (one folder per run)")
    export.add_argument("--experiment", default=None, metavar="NAME",
                        help="MLflow experiment (default precision-lab)")
    export.add_argument("--mlflow-timeout-s", dest="mlflow_timeout_s", default=None,
                        type=typed(float, "--mlflow-timeout-s"), metavar="S",
                        help="an http(s) tracking server must answer within this many "
                             "seconds, connect and each request (default 10)")
    export.add_argument("--baseline", metavar="RUN_ID", default=None,
                        help="run the ratios are computed against (default: the fp32 run, "
                             "else the first run)")
    export.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    export.set_defaults(func=cmd_export)


_EXAMPLES = {"--html": ("report.html", "a file name"), "--csv": ("metrics.csv", "a file name"),
             "--parquet": ("metrics.parquet", "a file name"),
             "--tensorboard": ("tb_logs", "a folder name"),
             "--mlflow": ("file:/data/mlruns", "a tracking URI"),
             "--experiment": ("precision-lab", "an experiment name")}


def cmd_export(args: argparse.Namespace) -> int:
    run_ids = [_checked_run_id(run_id, "RUN_ID") for run_id in args.run_ids]
    for flag, (example, what) in _EXAMPLES.items():  # before any file call sees them
        value = getattr(args, flag[2:])
        if value is not None:
            checked_path_text(value, flag, example, what)
    if args.baseline is not None:
        _checked_run_id(args.baseline, "--baseline")
    if args.baseline and not args.html:
        raise UsageError(f"--baseline {shown(args.baseline)}: applies to --html reports only")
    if args.experiment is not None and not args.mlflow:
        raise UsageError(f"--experiment {shown(args.experiment)}: applies to --mlflow only")
    if args.mlflow_timeout_s is not None and not args.mlflow:
        raise UsageError(f"--mlflow-timeout-s {args.mlflow_timeout_s:g}: applies to --mlflow only")
    if args.mlflow_timeout_s is not None and not 0 < args.mlflow_timeout_s <= 3600:
        raise UsageError(f"--mlflow-timeout-s {args.mlflow_timeout_s:g}: out of range; "
                         "give 0.1 to 3600 seconds, e.g. 10")
    store = Store()
    runs = []
    for run_id in run_ids:
        try:
            runs.append(store.get_run(run_id))
        except RunNotFound as exc:
            raise UsageError(f"RUN_ID {shown(run_id)}: no such run; `python -m engine list` "
                             "shows the runs") from exc
    if args.csv is not None or args.parquet is not None:
        return _export_metrics(store, runs, args)
    if args.mlflow is not None or args.tensorboard is not None:
        return _export_elsewhere(store, runs, args)
    return _export_html(store, run_ids, args)


def _export_html(store: Store, run_ids: list[str], args: argparse.Namespace) -> int:
    from engine.report.export import ExportTargetError  # pandas: only the export needs it
    from engine.report.html import export_html  # plotly and pandas: only the export needs them

    baseline = _checked_run_id(args.baseline, "--baseline") if args.baseline else None
    if baseline is not None and baseline not in run_ids:
        raise UsageError(f"--baseline {shown(baseline)}: not among the exported runs; "
                         f"choose one of {', '.join(run_ids)}")
    path = _checked_output_path(args.html)
    replacing = path.exists()
    try:
        written = export_html(store, run_ids, path, baseline_id=baseline)
    except ExportTargetError as exc:  # the target changed kind since the check above
        raise UsageError(f"--html {shown(args.html)}: {exc}") from None
    except OSError as exc:
        raise UsageError(f"--html {shown(args.html)}: cannot write the report "
                         f"({exc.strerror or exc}); choose a writable path") from None
    _say_replaced(replacing, "--html", written)
    info = {"path": str(written), "bytes": written.stat().st_size, "run_ids": run_ids,
            "replaced": replacing}
    print(json.dumps(info) if args.json else str(written))
    return EXIT_OK


def _say_replaced(replaced: bool, flag: str, path: Path) -> None:
    if replaced:
        print(f"note: {flag} {str(path)!r}: replaced the existing file", file=sys.stderr)


def _export_metrics(store: Store, runs: list, args: argparse.Namespace) -> int:
    # pandas/pyarrow: this export only
    from engine.report.export import ExportTargetError, write_metrics_file

    flag, target, file_format = (("--csv", args.csv, "csv") if args.csv is not None
                                 else ("--parquet", args.parquet, "parquet"))
    if len(runs) != 1:
        raise UsageError(f"{flag}: one run per file; give one RUN_ID (got {len(runs)})")
    path = _checked_output_path(target, flag)
    replacing = path.exists()
    try:
        written = write_metrics_file(store, runs[0].id, path, file_format)
    except ExportTargetError as exc:  # the target changed kind since the check above
        raise UsageError(f"{flag} {shown(target)}: {exc}") from None
    except OSError as exc:
        raise UsageError(f"{flag} {shown(target)}: cannot write ({exc.strerror or exc}); "
                         "choose a writable path") from None
    _say_replaced(replacing, flag, written)
    info = {"path": str(written), "bytes": written.stat().st_size, "run_ids": [runs[0].id],
            "rows": store.metrics_count(runs[0].id), "replaced": replacing}
    print(json.dumps(info) if args.json else str(written))
    return EXIT_OK


def _export_elsewhere(store: Store, runs: list, args: argparse.Namespace) -> int:
    """MLflow or TensorBoard: ended runs only (a running run's export would be partial)."""
    active = [run.id for run in runs if run.is_active]
    if active:
        raise UsageError(f"RUN_ID {active[0]!r}: still {store.get_run(active[0]).status}; "
                         "export it when it has ended")
    if args.mlflow:
        # mlflow: an optional extra, imported only for this export
        from engine.report.mlflow_export import (
            DEFAULT_EXPERIMENT,
            DEFAULT_TIMEOUT_S,
            TrackingServerUnreachable,
            check_tracking_server,
            export_to_mlflow,
            mlflow_problem,
        )

        if mlflow_problem():
            raise UsageError(f"--mlflow: {mlflow_problem()}")
        _check_tracking_uri(args.mlflow)
        timeout_s = args.mlflow_timeout_s or DEFAULT_TIMEOUT_S
        try:
            check_tracking_server(args.mlflow, timeout_s)
        except TrackingServerUnreachable as exc:
            raise UsageError(f"--mlflow {shown(args.mlflow)}: {exc}") from None
        try:
            exported = {run.id: export_to_mlflow(store, run.id, args.mlflow,
                                                 args.experiment or DEFAULT_EXPERIMENT,
                                                 timeout_s=timeout_s)
                        for run in runs}
        except Exception as exc:  # noqa: BLE001 - MLflow's own errors, as one line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise UsageError(f"--mlflow {shown(args.mlflow)}: MLflow refused the export "
                             f"({type(exc).__name__}: {first})") from None
        info = {"mlflow": args.mlflow, "experiment": args.experiment or DEFAULT_EXPERIMENT,
                "runs": exported}
    else:
        # tensorboard: an optional extra, imported only for this export
        from engine.report.tensorboard_export import export_to_tensorboard, tensorboard_problem

        if tensorboard_problem():
            raise UsageError(f"--tensorboard: {tensorboard_problem()}")
        logdir = _checked_logdir(args.tensorboard)
        try:
            exported = {run.id: str(export_to_tensorboard(store, run.id, logdir))
                        for run in runs}
        except OSError as exc:  # a full disk: the writer's one line, no traceback
            raise UsageError(f"--tensorboard {shown(args.tensorboard)}: {exc.strerror or exc}")
        info = {"tensorboard": str(logdir), "runs": exported}
    if args.json:
        print(json.dumps(info))
    else:
        for run_id, where in exported.items():
            print(f"{run_id} -> {where}")
    return EXIT_OK


def _check_tracking_uri(uri: str) -> None:
    """file: URIs must point at a folder that exists or can be made; others go to MLflow."""
    if uri.startswith("file:"):
        folder = Path(urlparse(uri).path or ".")
        parent = folder if folder.exists() else folder.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise UsageError(f"--mlflow {shown(uri)}: folder {str(parent)!r} does not exist or is "
                             "not writable; e.g. file:/tmp/mlruns")
    elif not uri.startswith(("http://", "https://", "databricks", "sqlite:", "postgresql:",
                             "mysql:")):
        raise UsageError(
            f"--mlflow {shown(uri)}: expected a tracking URI such as file:/data/mlruns "
            "or http://host:5000"
        )


def _checked_logdir(text: str) -> Path:
    path = Path(text).expanduser()
    parent = path if path.exists() else path.parent
    if path.exists() and not path.is_dir():
        raise UsageError(f"--tensorboard {shown(text)}: is a file; give a folder")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UsageError(
            f"--tensorboard {shown(text)}: folder {str(parent)!r} does not exist or is "
            "not writable; choose another folder"
        )
    return path


def _checked_run_id(run_id: str, field: str) -> str:
    try:
        return validate_run_id(run_id)
    except ValueError:
        raise UsageError(f"{field} {shown(run_id)}: not a valid run id (letters, digits, - and _); "
                         "`python -m engine list` shows the runs") from None


def _checked_output_path(text: str, flag: str = "--html") -> Path:
    """Fail before any work when the file could not be written there."""
    # the export writer's rule, one import: only the export needs it
    from engine.report.export import target_problem

    checked_path_text(text, flag, "report.html" if flag == "--html" else "metrics.csv")
    path = Path(text).expanduser()
    problem = target_problem(path)
    if problem is not None and not path.is_dir():
        raise UsageError(f"{flag} {shown(text)}: {problem}; choose another path")
    if path.is_dir():
        raise UsageError(
            f"{flag} {shown(text)}: is a directory; give a file name, e.g. "
            f"{os.path.join(text, 'report.html' if flag == '--html' else 'metrics.csv')}"
        )
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{flag} {shown(text)}: folder {str(parent)!r} does not exist; "
                         "create it or choose another path")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{flag} {shown(text)}: folder {str(parent)!r} is not writable; "
                         "choose another path")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{flag} {shown(text)}: file exists and is not writable; "
                         "choose another path")
    return path
