"""Your own model: the contract a workload file or module fulfils, and where the app finds them.

A workload is a Python file (or an importable module) with a function that takes the
run's RunConfig and returns a `Workload`:

    from engine.workloads import Workload

    def build(cfg):                     # cfg: engine.config.RunConfig
        return Workload(model=..., batches=..., loss=...)

Run it with `python -m engine run --model-file path/to/workload.py` (function `build`),
`--model my_pkg.module:function`, or in the app from the files in the folder named by
PRECISION_LAB_WORKLOADS. The full contract: docs/workloads.md.

No torch here: the Launch page lists the folder's files (reading their docstrings, never
importing them) and the trainer process imports the one a run names
(engine/training/workload.py).
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

WORKLOADS_ENV = "PRECISION_LAB_WORKLOADS"  # the folder the app offers workloads from
DEFAULT_FUNCTION = "build"  # what a workload file must define
MAX_LISTED = 200  # a folder of thousands of files is not a menu


@dataclass
class Workload:
    """What your build(cfg) returns.

    model: a torch.nn.Module. The engine moves it to the device and applies the precision
        mode (autocast, bf16-pure casts, fp8 conversion) and channels_last / compile.
    batches: where (inputs, targets) come from, one of
        - a function `batches(step) -> (inputs, targets)` called every step (step counts
          from 1; the same seed should give the same batches), or
        - a torch.utils.data.Dataset of (input, target) samples: it goes through
          torch.utils.data.DataLoader with the run's batch_size and input-pipeline options
          (num_workers, pin_memory, persistent_workers, prefetch_factor).
        `inputs` is a tensor, or a tuple of tensors passed to the model as positional
        arguments; tensors are moved to the device for you.
    loss: `loss(outputs, targets) -> scalar tensor`; None: cross-entropy of the logits
        (flattened over the sequence for (batch, seq, vocab) logits; -100 is ignored).
    tokens_per_sample: set it for sequence models so throughput is also in tokens/s.
    """
    model: Any
    batches: Any
    loss: Callable[[Any, Any], Any] | None = None
    tokens_per_sample: int | None = None


@dataclass(frozen=True)
class WorkloadFile:
    name: str      # the file name, e.g. tiny_transformer.py
    path: str      # absolute path: what RunConfig.workload holds for it
    summary: str   # the first line of its docstring ("" when it has none)


def workloads_dir() -> Path | None:
    """The folder PRECISION_LAB_WORKLOADS names, or None when it is not set."""
    value = os.environ.get(WORKLOADS_ENV, "").strip()
    return Path(value).expanduser().resolve() if value else None


def discover_workloads(folder: Path | None = None) -> list[WorkloadFile]:
    """The workload files (*.py, not starting with _) in `folder` (default: the
    configured one), sorted by name. Read as text, never imported: listing a folder must
    not run its code."""
    folder = folder if folder is not None else workloads_dir()
    if folder is None or not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("*.py"))[:MAX_LISTED]:
        if path.name.startswith("_") or not path.is_file():
            continue
        found.append(WorkloadFile(path.name, str(path.resolve()), _summary_line(path)))
    return found


def _summary_line(path: Path) -> str:
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return ""
    return (doc or "").strip().splitlines()[0][:200] if doc and doc.strip() else ""


def workload_label(spec: str) -> str:
    """A workload as people name it: the file name, or module:function."""
    return spec.replace("\\", "/").rsplit("/", 1)[-1]
