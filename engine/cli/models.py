"""`python -m engine models [--json]`: every model name a run can use, its parameter
count, and whether the optional package it needs is installed here."""

from __future__ import annotations

import argparse
import json
from typing import Any

from engine.architectures import ARCHITECTURES, EXTRA_INSTALL, HOME_MADE_TASKS, missing_extra
from engine.cli.errors import EXIT_OK
from engine.config import ModelSize, RunConfig, choices
from engine.workloads import WORKLOADS_ENV, discover_workloads, workloads_dir


def add_subparsers(sub) -> None:
    parser = sub.add_parser("models", help="the model names --model takes, with parameter "
                                           "counts and whether their extra is installed")
    parser.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    parser.set_defaults(func=cmd_models)


def model_rows() -> list[dict[str, Any]]:
    rows = []
    home_made = _home_made_counts()
    for name, task in HOME_MADE_TASKS.items():
        rows.append({"name": name, "task": task, "library": "engine (home-made)",
                     "param_count": home_made[name], "installed": True, "reason": None,
                     "description": f"home-made {name}; --size picks "
                                    f"{', '.join(choices(ModelSize))}"})
    for arch in ARCHITECTURES.values():
        reason = missing_extra(arch.name)
        rows.append({"name": arch.name, "task": arch.task, "library": arch.library,
                     "param_count": arch.param_count, "installed": reason is None,
                     "reason": reason, "description": arch.description})
    return rows


def _home_made_counts() -> dict[str, dict[str, int]]:
    """Parameter counts per size, built on the meta device (no memory, no init time)."""
    import torch  # only this command builds models; the CLI's start-up stays torch-free

    from engine.training.models import build_model, parameter_count  # imports torch

    counts: dict[str, dict[str, int]] = {}
    with torch.device("meta"):
        for name in HOME_MADE_TASKS:
            counts[name] = {size: parameter_count(build_model(RunConfig(model=name, size=size)))
                            for size in choices(ModelSize)}
    return counts


def cmd_models(args: argparse.Namespace) -> int:
    rows = model_rows()
    folder = workloads_dir()
    workloads = [w.path for w in discover_workloads(folder)]
    if args.json:
        print(json.dumps({"models": rows, "workloads_dir": str(folder) if folder else None,
                          "workloads": workloads}))
        return EXIT_OK
    print(f"{'name':<34} {'parameters':>24}  installed")
    for row in rows:
        count = row["param_count"]
        shown = ("/".join(f"{v / 1e6:.2f}M" for v in count.values())
                 if isinstance(count, dict) else f"{count / 1e6:.1f}M")
        installed = "yes" if row["installed"] else f"no ({row['reason']})"
        print(f"{row['name']:<34} {shown:>24}  {installed}")
    print("  (home-made: tiny/small/medium; ViT-B/16 counted at 224 px)")
    print("custom: your own workload, --model-file PATH.py or --model my_pkg.module:function "
          "(docs/workloads.md)")
    if folder:
        print(f"{WORKLOADS_ENV}={folder}: {len(workloads)} workload file(s)")
    else:
        print(f"{WORKLOADS_ENV} is not set: the app offers no workload files")
    if any(not row["installed"] for row in rows):
        print(f"the architectures marked 'no' need: {EXTRA_INSTALL}")
    return EXIT_OK
