"""Benchmarks that print ratios measured side by side in one run (not timed tests).

Run them from the repository root, e.g. `python -m bench.overhead --json`. Each prints a
readable table and, with `--json`, one JSON object as its last stdout line.
"""
