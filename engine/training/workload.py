"""Import a run's own workload (RunConfig.workload) and check what its build() returned.

Importing the file or module a run names is the documented contract (docs/workloads.md):
the path comes from the CLI (`--model-file`, `--model module:function`) or from the
app's list of the PRECISION_LAB_WORKLOADS folder, never from a browser upload, and
nothing is passed to a shell or eval. Whatever the user's code raises becomes a
`WorkloadError`: one line for the page and `show`, the user's traceback (chained) in the
run's log.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from engine.config import RunConfig
from engine.workloads import DEFAULT_FUNCTION, Workload, workload_label


class WorkloadError(RuntimeError):
    """The user's workload failed; the message is one line, the cause its traceback."""


def one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[:limit] + "..."


def load_workload(cfg: RunConfig) -> Workload:
    """Import cfg.workload, call its function with cfg, check the Workload."""
    label = workload_label(cfg.workload)
    build = _find_builder(cfg.workload.strip(), label)
    try:
        workload = build(cfg)
    except Exception as exc:
        raise WorkloadError(f"workload {label}: build() raised {one_line(exc)} (traceback in "
                            "the run's log)") from exc
    _check(workload, label)
    return workload


def _find_builder(spec: str, label: str) -> Callable[[RunConfig], Any]:
    if spec.endswith(".py"):
        module, function = _import_file(Path(spec).expanduser(), label), DEFAULT_FUNCTION
    else:
        module_name, function = spec.rsplit(":", 1)
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise WorkloadError(f"workload {label}: importing {module_name} raised "
                                f"{one_line(exc)}; it must be importable by the trainer "
                                "(installed, or on PYTHONPATH)") from exc
    builder = getattr(module, function, None)
    if not callable(builder):
        raise WorkloadError(f"workload {label}: defines no function {function}(cfg); see "
                            "docs/workloads.md")
    return builder


def _import_file(path: Path, label: str):
    if not path.is_file():
        raise WorkloadError(f"workload {label}: no such file {str(path)!r}; give the path of a "
                            ".py file")
    module_name = f"precision_lab_workload_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise WorkloadError(f"workload {label}: not a loadable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling (DataLoader workers) look here
    sys.path.insert(0, str(path.parent.resolve()))  # its neighbours import like a script's
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise WorkloadError(f"workload {label}: importing it raised {one_line(exc)} "
                            "(traceback in the run's log)") from exc
    return module


def _check(workload: Any, label: str) -> None:
    if not isinstance(workload, Workload):
        raise WorkloadError(f"workload {label}: build() returned {type(workload).__name__}; "
                            "return engine.workloads.Workload(model=..., batches=..., loss=...)")
    if not isinstance(workload.model, torch.nn.Module):
        raise WorkloadError(f"workload {label}: Workload.model is a "
                            f"{type(workload.model).__name__}; it must be a torch.nn.Module")
    if not (callable(workload.batches) or is_dataset(workload.batches)):
        raise WorkloadError(f"workload {label}: Workload.batches is a "
                            f"{type(workload.batches).__name__}; give a function "
                            "batches(step) -> (inputs, targets) or a torch.utils.data.Dataset")
    if workload.loss is not None and not callable(workload.loss):
        raise WorkloadError(f"workload {label}: Workload.loss must be a function "
                            "loss(outputs, targets) or None")


def is_dataset(source: Any) -> bool:
    return isinstance(source, (torch.utils.data.Dataset, torch.utils.data.IterableDataset))
