"""`python -m engine ...`: the same runs as the app, headless, for terminals, CI and scripts.

Contract (scripts depend on it): invalid input exits 2 with one line on stderr naming
the field; `--json` makes the last stdout line one JSON object. One module per command
group registers its sub-commands here.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from engine.cli import hardware, kernels, manage, models, report, runs, speedup, standby, sweep
from engine.cli.errors import EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, Parser, UsageError
from engine.store import RunNotFound, StoreError

MAX_ERROR_CHARS = 400


def _one_line(text: str) -> str:
    """An error as one line of bounded length (a 100 kB value is not repeated in full)."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "... (cut)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m engine",
                    description="Precision Lab: mixed-precision training runs, headless.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in (runs, speedup, manage, kernels, hardware, report, sweep, standby, models):
        group.add_subparsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return args.func(args)
    except UsageError as exc:
        print(f"error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except RunNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_RUN_FAILED
    except BrokenPipeError:  # `python -m engine list | head`
        return EXIT_OK
