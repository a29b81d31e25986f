"""`python -m engine export RUN_ID [RUN_ID ...] --html PATH`: the HTML report, headless.

Registered by engine.cli.main (it calls
`add_subparsers`). Bad input exits 2 with one line naming the field.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from engine.cli.errors import EXIT_OK, UsageError
from engine.store import RunNotFound, Store, validate_run_id


def add_subparsers(sub) -> None:
    export = sub.add_parser(
        "export", help="write a self-contained HTML report of one or more runs")
    export.add_argument("run_ids", nargs="+", metavar="RUN_ID",
                        help="runs to report (`python -m engine list` shows them)")
    export.add_argument("--html", required=True, metavar="PATH",
                        help="file to write; opens offline (plotly.js is embedded)")
    export.add_argument("--baseline", metavar="RUN_ID", default=None,
                        help="run the ratios are computed against (default: the fp32 run, "
                             "else the first run)")
    export.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    export.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from engine.report.html import export_html  # plotly and pandas: only the export needs them

    run_ids = [_checked_run_id(run_id, "RUN_ID") for run_id in args.run_ids]
    baseline = _checked_run_id(args.baseline, "--baseline") if args.baseline else None
    if baseline is not None and baseline not in run_ids:
        raise UsageError(f"--baseline {baseline!r}: not among the exported runs; "
                         f"choose one of {', '.join(run_ids)}")
    path = _checked_output_path(args.html)
    store = Store()
    for run_id in run_ids:
        try:
            store.get_run(run_id)
        except RunNotFound as exc:
            raise UsageError(f"RUN_ID {run_id!r}: no such run; `python -m engine list` "
                             "shows the runs") from exc
    try:
        written = export_html(store, run_ids, path, baseline_id=baseline)
    except OSError as exc:
        raise UsageError(f"--html {args.html!r}: cannot write the report "
                         f"({exc.strerror or exc}); choose a writable path") from None
    info = {"path": str(written), "bytes": written.stat().st_size, "run_ids": run_ids}
    print(json.dumps(info) if args.json else str(written))
    return EXIT_OK


def _checked_run_id(run_id: str, field: str) -> str:
    try:
        return validate_run_id(run_id)
    except ValueError:
        raise UsageError(f"{field} {run_id!r}: not a valid run id (letters, digits, - and _); "
                         "`python -m engine list` shows the runs") from None


def _checked_output_path(text: str) -> Path:
    """Fail before any work when the report could not be written there."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise UsageError(f"--html {text!r}: is a directory; give a file name, e.g. "
                         f"{os.path.join(text, 'report.html')}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"--html {text!r}: folder {str(parent)!r} does not exist; "
                         "create it or choose another path")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"--html {text!r}: folder {str(parent)!r} is not writable; "
                         "choose another path")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"--html {text!r}: file exists and is not writable; "
                         "choose another path")
    return path
