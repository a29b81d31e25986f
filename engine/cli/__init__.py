"""The command line (`python -m engine`, `precision-lab`). Nothing outside engine/cli
imports it: it is a client of the engine like the pages are."""

from engine.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
