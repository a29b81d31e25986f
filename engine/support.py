"""Which PyTorch this project supports, and which optional parts are installed: answered
from package metadata and import specs, without importing torch (the server, the
supervisor and `doctor` ask it; a GPU node keeps its own PyTorch build).

The range: the oldest release whose public APIs the engine uses (2.6: FSDP2's
`torch.distributed.fsdp.fully_shard` and `MixedPrecisionPolicy`; `torch.amp.GradScaler`
for both devices) up to the newest release CI has run the whole suite on (2.13). Older is
refused where a run starts, newer is allowed with a warning that it is untested.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass

TORCH_OLDEST = (2, 6)          # fully_shard / MixedPrecisionPolicy are public from 2.6
TORCH_NEWEST_TESTED = (2, 13)  # the CI suite runs on 2.13.0 (constraints-ci.txt)
TORCH_RANGE = "torch>=2.6,<2.14"  # the same range as requirements.txt and pyproject.toml


def _release(version: str) -> tuple[int, int] | None:
    """"2.11.0+cu130" -> (2, 11); None when it does not start with two numbers."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


@functools.lru_cache(
    maxsize=None
)  # a metadata scan costs ms; installs do not change under a process
def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class TorchSupport:
    version: str | None
    ok: bool             # a run may start (in the range, or newer than tested)
    warning: str | None  # newer than tested: it may work
    problem: str | None  # missing or too old: the sentence with the fix

    def to_dict(self) -> dict:
        return {"version": self.version, "ok": self.ok, "warning": self.warning,
                "problem": self.problem, "supported": TORCH_RANGE}


def torch_support(version: str | None = None) -> TorchSupport:
    """Is this PyTorch one the project supports? `version` defaults to the installed one."""
    version = version if version is not None else installed_version("torch")
    if version is None:
        return TorchSupport(None, False, None,
                            f"PyTorch is not installed: pip install '{TORCH_RANGE}' (a GPU node "
                            "keeps its own CUDA build: install it first, then this project)")
    release = _release(version)
    if release is None:
        return TorchSupport(version, True, f"torch {version}: version not recognised; "
                            f"supported is {TORCH_RANGE}", None)
    if release < TORCH_OLDEST:
        oldest = ".".join(map(str, TORCH_OLDEST))
        return TorchSupport(version, False, None,
                            f"torch {version} is older than {oldest}, the oldest this project "
                            f"supports (it uses torch.distributed.fsdp.fully_shard): "
                            f"pip install '{TORCH_RANGE}'")
    if release > TORCH_NEWEST_TESTED:
        newest = ".".join(map(str, TORCH_NEWEST_TESTED))
        return TorchSupport(version, True, f"torch {version} is newer than {newest}, the newest "
                            "this project is tested on: it may work; what breaks is worth a "
                            "report", None)
    return TorchSupport(version, True, None, None)


@dataclass(frozen=True)
class OptionalPart:
    extra: str            # the pyproject extra that installs it
    module: str           # the import name looked for
    needed_for: str
    installed: bool

    def to_dict(self) -> dict:
        return {"extra": self.extra, "module": self.module, "needed_for": self.needed_for,
                "installed": self.installed,
                "install": f'pip install "precision-lab[{self.extra}]"' if self.extra != "fp8"
                else "pip install torchao"}


# (extra, import name, what it is needed for)
OPTIONAL_PARTS = (
    ("fp8", "torchao", "the fp8 mode (torchao's float8 training linears, sm89+ GPUs)"),
    ("models", "torchvision", "the torchvision architectures (torchvision:resnet50, ...)"),
    ("models", "transformers", "the Hugging Face architectures (hf:gpt2, hf:bert-base, ...)"),
    ("export", "mlflow", "export to MLflow (export --mlflow URI)"),
    ("export", "tensorboard", "TensorBoard event files (export --tensorboard DIR)"),
    ("ray", "ray", "sweeps on a Ray cluster (sweep create --ray-address ...)"),
    ("bench", "hta", "bench.traces' comparison with HolisticTraceAnalysis"),
)


def optional_parts() -> list[OptionalPart]:
    return [OptionalPart(extra, module, needed_for, _importable(module))
            for extra, module, needed_for in OPTIONAL_PARTS]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-installed package
        return False
