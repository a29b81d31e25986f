"""Run configuration: the closed set of choices and the one validated `RunConfig`.

The enum values feed the UI's choices, the CLI's `choices=` and the error messages,
so a new mode or model is added in exactly one place.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from engine.architectures import ARCHITECTURES, CUSTOM


class ConfigError(ValueError):
    """A value a user gave is not acceptable. Names the field, the value and the fix."""

    def __init__(self, field_name: str, value: Any, fix: str):
        self.field = field_name
        self.value = value.value if isinstance(value, Enum) else value  # as the user typed it
        self.fix = fix
        shown = repr(self.value)
        if len(shown) > 80:  # a pasted 100 kB value is not repeated in full
            shown = f"{shown[:80]}... ({len(shown)} characters)"
        super().__init__(f"{field_name}={shown}: {fix}")


def env_number(name: str, default: float, low: float, high: float,
               unit: str) -> tuple[float, str | None]:
    """A number setting from the environment: (value, None) when `name` is unset or in
    [low, high], else (default, the sentence that says why the value given is not used)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default, None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and low <= value <= high:
        return value, None
    return default, (f"{name}={text[:40]!r} is not a number of {unit} in [{low:g}, {high:g}]; "
                     f"using {default:g}")


class Choice(str, Enum):
    """A closed set of string choices. A member is its value: it compares, hashes, formats
    and serialises (JSON, SQLite) as the plain string, so `cfg.precision == "fp32"` and
    f"{cfg.precision}" read as before while the field is typed."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Precision(Choice):
    FP32 = "fp32"
    TF32 = "tf32"
    FP16_AMP = "fp16-amp"
    BF16_AMP = "bf16-amp"
    BF16_PURE = "bf16-pure"
    FP8 = "fp8"

    @property
    def label(self) -> str:
        return PRECISION_LABELS[self]

    @property
    def compute_dtype(self) -> str:
        """The dtype this mode's matrix work runs in: keys the peak table and the
        Tensor-Core verdict (fp32 | tf32 | fp16 | bf16 | fp8)."""
        return COMPUTE_DTYPES[self]


PRECISION_LABELS = {
    Precision.FP32: "fp32: full precision, TF32 off",
    Precision.TF32: "tf32: fp32 tensors, matmuls on TF32 Tensor Cores",
    Precision.FP16_AMP: "fp16-amp: autocast to float16 + GradScaler",
    Precision.BF16_AMP: "bf16-amp: autocast to bfloat16, no scaler",
    Precision.BF16_PURE: "bf16-pure: weights, activations, optimizer state in bfloat16",
    Precision.FP8: "fp8: float8 matmuls via torchao (sm89+)",
}


# Precision mode -> the dtype its matmuls run in (docs/precision-reference.md#precision-modes).
COMPUTE_DTYPES = {
    Precision.FP32: "fp32", Precision.TF32: "tf32", Precision.FP16_AMP: "fp16",
    Precision.BF16_AMP: "bf16", Precision.BF16_PURE: "bf16", Precision.FP8: "fp8",
}


class ModelName(Choice):
    """The home-made models (mlp, resnet, gpt: `size` picks tiny/small/medium), the known
    architectures by name (engine.architectures: library code, random weights) and
    `custom`: your own workload file or module (`workload`, docs/workloads.md)."""
    MLP = "mlp"
    RESNET = "resnet"
    GPT = "gpt"
    TV_RESNET50 = "torchvision:resnet50"
    TV_VIT_B_16 = "torchvision:vit_b_16"
    TV_MOBILENET_V3_LARGE = "torchvision:mobilenet_v3_large"
    TV_CONVNEXT_TINY = "torchvision:convnext_tiny"
    HF_GPT2 = "hf:gpt2"
    HF_LLAMA_SMALL = "hf:llama-small"
    HF_BERT_BASE = "hf:bert-base"
    CUSTOM = CUSTOM


class DataMode(Choice):
    """Where batches come from (RunConfig.data)."""
    SYNTHETIC = "synthetic"  # generated on the training device: no input pipeline at all
    LOADER = "loader"        # host-side files through torch.utils.data.DataLoader


class ModelSize(Choice):
    TINY = "tiny"
    SMALL = "small"
    MEDIUM = "medium"


class OptimizerName(Choice):
    ADAMW = "adamw"
    SGD = "sgd"


class Sharding(Choice):
    """How a multi-process run spreads the model (RunConfig.nprocs > 1)."""
    DDP = "ddp"
    FSDP2 = "fsdp2"


class CommHook(Choice):
    """The dtype gradients travel in between processes (RunConfig.nprocs > 1)."""
    NONE = "none"
    FP16 = "fp16"
    BF16 = "bf16"


def compute_dtype_for(precision: str) -> str:
    """Precision mode (member or value) -> the dtype its matrix work runs in."""
    return Precision(precision).compute_dtype


def choices(enum_type: type[Enum]) -> list[str]:
    return [member.value for member in enum_type]


# Bounds a user can hit; kept generous but finite so a typo cannot ask for a week-long run.
MAX_BATCH_SIZE = 65_536
MAX_STEPS = 1_000_000
MAX_SEQ_LEN = 8_192
MAX_IMAGE_SIZE = 512
# The machine's own limit (GPUs, CPU cores) is checked by engine.admission.check_runnable.
MAX_NPROCS = 64
# A smaller address-space cap cannot even start the interpreter (exit 127), let alone load
# PyTorch; caps from here up fail, if too small, with "too small to load PyTorch".
MIN_MEMORY_CAP_MB = 256
MAX_SPEEDUP_MODES = 4  # every mode holds its own model copy and optimizer in one process
SPEEDUP_MODES_FIX = (f"2 to {MAX_SPEEDUP_MODES} comma-separated precision modes, the baseline "
                     "first, e.g. fp32,bf16-amp")
MAX_LOADER_WORKERS = 32  # each is a process holding a copy of the dataset object
MAX_PREFETCH_FACTOR = 64
MAX_WORKLOAD_CHARS = 1000

# (lowest, highest, what to give) of every numeric field: RunConfig's checks and the UI's
# inputs both read these, so a bound is changed in one place.
INT_BOUNDS: dict[str, tuple[int, int, str]] = {
    "batch_size": (1, MAX_BATCH_SIZE, "a positive batch size, e.g. 16"),
    "steps": (1, MAX_STEPS, "a step count between 1 and 1000000"),
    "seq_len": (2, MAX_SEQ_LEN, "a sequence length between 2 and 8192"),
    "image_size": (8, MAX_IMAGE_SIZE, "an image size between 8 and 512"),
    "grad_scaler_growth_interval": (1, 10**7, "a positive interval, e.g. 2000"),
    "log_interval": (1, 10_000, "log every 1..10000 steps"),
    "warmup_steps": (0, MAX_STEPS, "0 or more warm-up steps"),
    "profile_steps": (1, 50, "a profiler window of 1..50 steps"),
    "memory_cap_mb": (0, 10**8, f"0 (no cap) or a cap of at least {MIN_MEMORY_CAP_MB} MiB, "
                                "e.g. 4096"),
    "seed": (0, 2**31 - 1, "a seed between 0 and 2**31-1"),
    "nprocs": (1, MAX_NPROCS, f"1 process, or 2..{MAX_NPROCS} for a multi-process run"),
    "num_workers": (0, MAX_LOADER_WORKERS, f"0 (load in the training process) or up to "
                                           f"{MAX_LOADER_WORKERS} DataLoader worker processes"),
    "prefetch_factor": (1, MAX_PREFETCH_FACTOR, f"batches each worker loads ahead, "
                                                f"1..{MAX_PREFETCH_FACTOR}, e.g. 2"),
}
FLOAT_BOUNDS: dict[str, tuple[float, float, str]] = {
    "lr": (0.0, 10.0, "a learning rate in (0, 10], e.g. 3e-3"),
    "weight_decay": (0.0, 1.0, "a weight decay in [0, 1]"),
    "grad_scaler_init_scale": (0.0, 2.0**32, "a positive initial loss scale, e.g. 65536"),
    "speedup_budget_s": (5.0, 3600.0, "a time budget of 5..3600 s, e.g. 120"),
    "speedup_target_pct": (0.5, 50.0, "an interval half-width target of 0.5..50 %, e.g. 3"),
}
OPEN_LOW_BOUNDS = frozenset({"lr", "grad_scaler_init_scale"})  # the lowest value itself is refused


def bounds(field_name: str) -> tuple[int | float, int | float]:
    """(lowest, highest) a numeric RunConfig field accepts."""
    low, high, _fix = INT_BOUNDS.get(field_name) or FLOAT_BOUNDS[field_name]
    return low, high


def plain_number(value: int | float) -> str:
    """A bound as people write it: "1,000,000", "65536" in digits, "0.001", never
    "1e+06" (a range printed as "1..1e+06" reads as a typo)."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:.10f}".rstrip("0").rstrip(".")


_WHOLE_NUMBER = re.compile(r"^[+-]?\d[\d,_]*$")


def parse_whole(field_name: str, text: str, label: str | None = None) -> int:
    """A whole-number field typed as text: digits only (commas and underscores between them
    allowed), within the field's bounds. "1e9", "3.7" or "" raise ConfigError naming the
    field, the value and the allowed range: never silently 1 or 3."""
    low, high = bounds(field_name)
    allowed = f"a whole number from {plain_number(low)} to {plain_number(high)}"
    text = str(text).strip()
    if not _WHOLE_NUMBER.match(text):
        raise ConfigError(label or field_name, text, allowed)
    number = int(text.replace(",", "").replace("_", ""))
    if not low <= number <= high:
        raise ConfigError(label or field_name, text, allowed)
    return number


_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d{1,2})?)$")
_NAME_RE = re.compile(r"^[\w .,:+()\-]{0,80}$")
# A workload: a file path ending in .py, or an importable module:function (never run
# through a shell or eval: engine/training/workload.py imports it).
_WORKLOAD_MODULE_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
WORKLOAD_FIX = ("a workload file (path/to/workload.py) or an importable module:function "
                "(e.g. my_pkg.workloads:build); see docs/workloads.md")


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one training run. Units are in the field names or docs."""

    model: ModelName = ModelName.GPT
    """mlp | resnet | gpt (home-made, sized by `size`), a known architecture
    (torchvision:resnet50, hf:gpt2, ...: `python -m engine models`) or custom (`workload`)."""
    size: ModelSize = ModelSize.TINY
    """mlp/resnet/gpt only: tiny (seconds on 2 CPU cores) | small | medium (about GPT-2
    small, 124M; for GPUs). Known architectures have their own fixed size."""
    workload: str = ""
    """model custom only: your workload, a file path/to/workload.py or an importable
    module:function returning a Workload (docs/workloads.md)."""
    precision: Precision = Precision.FP32
    """Precision mode, see `Precision`."""
    batch_size: int = 16
    """Samples per optimizer step (sequences for gpt, images for resnet)."""
    steps: int = 60
    """Optimizer steps to run."""
    lr: float = 3e-3
    """Peak learning rate (constant after a linear warm-up of `warmup_steps`)."""
    optimizer: OptimizerName = OptimizerName.ADAMW
    weight_decay: float = 0.0
    seed: int = 0
    device: str = "auto"
    """auto | cpu | cuda | cuda:N. auto picks cuda:0 when a GPU is present."""
    seq_len: int = 64
    """Tokens per sequence (gpt only)."""
    image_size: int = 32
    """Image side in pixels (resnet only)."""
    channels_last: bool = False
    """Use channels_last memory format (resnet only; helps Tensor-Core convs)."""
    compile: bool = False
    """Wrap the model in torch.compile (first steps then include compile time)."""
    data: DataMode = DataMode.SYNTHETIC
    """synthetic (batches generated on the device: no input pipeline) | loader (real files
    on the host through torch.utils.data.DataLoader: stdlib source text as bytes for
    sequence models, JPEG files decoded by PIL for image models)."""
    num_workers: int = 0
    """data loader (or a workload's Dataset): DataLoader worker processes (0 = load in the
    training process). The DataLoader options are unused with synthetic data."""
    pin_memory: bool = False
    """data loader: page-locked host batches, copied to a GPU asynchronously (CUDA only)."""
    persistent_workers: bool = False
    """data loader with workers: keep the worker processes between passes over the data."""
    prefetch_factor: int = 2
    """data loader with workers: batches each worker loads ahead."""
    nprocs: int = 1
    """Training processes, started by torchrun: one per GPU on CUDA (cuda:0..N-1 from the
    run's device), gloo processes on a CPU. batch_size is per process: the global batch is
    batch_size x nprocs. Rank 0 records the metrics (loss averaged over the ranks,
    throughput summed)."""
    sharding: Sharding = Sharding.DDP
    """nprocs > 1: ddp (each process holds the whole model, gradients are all-reduced) |
    fsdp2 (parameters, gradients and optimizer state sharded with torch's fully_shard; its
    MixedPrecisionPolicy follows the precision mode)."""
    comm_hook: CommHook = CommHook.NONE
    """nprocs > 1: the dtype gradients are communicated in. none (fp32; bf16-pure: bf16) |
    fp16 | bf16. ddp: DDP's fp16_compress_hook / bf16_compress_hook; fsdp2: the policy's
    reduce_dtype."""
    grad_scaler_init_scale: float = 65536.0
    """fp16-amp only: GradScaler's initial loss scale (2**16 by default)."""
    grad_scaler_growth_interval: int = 2000
    """fp16-amp only: good steps before the scale doubles."""
    loss_scaling: bool = True
    """fp16-amp only: False disables the GradScaler (demonstrates fp16 underflow)."""
    numerics: bool = False
    """Record per-layer gradient and activation magnitudes at a few sampled steps
    (runs/<id>/numerics.json; the Compare page's Numerics view)."""
    log_interval: int = 1
    """Read metrics back from the device every N steps (each read is a host sync)."""
    warmup_steps: int = 3
    """Steps excluded from steady-state averages (allocator, autotuning, compile)."""
    profile: bool = True
    """Profile a short window of steps after warm-up (kernel breakdown)."""
    profile_steps: int = 3
    """Length of the profiler window in steps."""
    memory_cap_mb: int = 0
    """CPU runs: address-space cap for the training process in MiB (0 = none)."""
    speedup_modes: str = ""
    """A paired speedup check instead of a training run: 2-4 comma-separated precision
    modes (the first is the baseline and equals `precision`), measured interleaved in one
    process (engine.training.speedup). Empty: a normal run."""
    speedup_budget_s: float = 120.0
    """Speedup check: its wall time in seconds, set-up (warm-up, calibration, memory step)
    included; a mode whose step cannot fit it is left out, with the reason."""
    speedup_target_pct: float = 3.0
    """Speedup check: stop early once every 95 % interval is within this many % of its
    speedup."""
    name: str = ""
    """Optional label shown in the UI."""

    def __post_init__(self) -> None:
        self._coerce_enums()
        for name, (low, high, fix) in INT_BOUNDS.items():
            _check_int(self, name, low, high, fix)
        if 0 < self.memory_cap_mb < MIN_MEMORY_CAP_MB:
            raise ConfigError("memory_cap_mb", self.memory_cap_mb,
                              f"a cap below {MIN_MEMORY_CAP_MB} MiB leaves the interpreter no "
                              f"room to start; use 0 (no cap) or at least {MIN_MEMORY_CAP_MB}")
        for name, (low, high, fix) in FLOAT_BOUNDS.items():
            _check_float(self, name, low, high, fix, open_low=name in OPEN_LOW_BOUNDS)
        for flag in ("channels_last", "compile", "loss_scaling", "profile", "numerics",
                     "pin_memory", "persistent_workers"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(flag, getattr(self, flag), "true or false")
        if not isinstance(self.device, str) or not _DEVICE_RE.fullmatch(self.device):
            raise ConfigError("device", self.device, "one of auto, cpu, cuda, cuda:N")
        if not isinstance(self.name, str) or not _NAME_RE.fullmatch(self.name):
            raise ConfigError("name", self.name,
                              "up to 80 letters, digits, spaces and . , : + ( ) - _")
        self._check_multi_process()
        self._check_speedup()
        self._check_workload()
        self._check_architecture_inputs()

    def _check_workload(self) -> None:
        if not isinstance(self.workload, str) or len(self.workload) > MAX_WORKLOAD_CHARS \
                or any(ch in self.workload for ch in "\0\n\r"):
            raise ConfigError("workload", self.workload, WORKLOAD_FIX)
        if self.model == ModelName.CUSTOM.value:
            text = self.workload.strip()
            if not text.endswith(".py") and not _WORKLOAD_MODULE_RE.fullmatch(text):
                raise ConfigError("workload", self.workload, f"model custom needs {WORKLOAD_FIX}")
        elif self.workload:
            raise ConfigError("workload", self.workload,
                              f"a workload is run by model custom; set model custom, or "
                              f"clear workload to train {self.model}")

    def _check_architecture_inputs(self) -> None:
        """Input sizes a known architecture cannot take (its patch side, its position table)."""
        arch = ARCHITECTURES.get(self.model.value)
        if arch is None:
            return
        if self.image_size % arch.image_multiple:
            nearest = max(arch.image_multiple,
                          self.image_size // arch.image_multiple * arch.image_multiple)
            raise ConfigError(
                "image_size",
                self.image_size,
                f"{arch.name} cuts images into {arch.image_multiple} px patches; "
                f"use a multiple of {arch.image_multiple}, e.g. {nearest}",
            )
        if arch.max_seq_len is not None and self.seq_len > arch.max_seq_len:
            raise ConfigError("seq_len", self.seq_len,
                              f"{arch.name} has positions for {arch.max_seq_len} tokens; use "
                              f"seq_len <= {arch.max_seq_len}")

    def _check_speedup(self) -> None:
        if not isinstance(self.speedup_modes, str):
            raise ConfigError("speedup_modes", self.speedup_modes, SPEEDUP_MODES_FIX)
        if not self.speedup_modes:
            return
        modes = self.speedup_mode_list
        unknown = [mode for mode in modes if mode not in choices(Precision)]
        if unknown:
            raise ConfigError("speedup_modes", unknown[0],
                              f"unknown precision; choose from {', '.join(choices(Precision))}")
        if not 2 <= len(modes) <= MAX_SPEEDUP_MODES:
            raise ConfigError("speedup_modes", self.speedup_modes, SPEEDUP_MODES_FIX)
        if modes[0] != self.precision:
            raise ConfigError("precision", self.precision,
                              f"a speedup check's precision is its baseline, the first of "
                              f"speedup_modes; set precision to {modes[0]}")
        if self.nprocs != 1:
            raise ConfigError("nprocs", self.nprocs,
                              "a speedup check runs its modes in one process; set nprocs to 1")

    @property
    def speedup_mode_list(self) -> list[str]:
        """speedup_modes as a list (empty for a normal run)."""
        return [mode.strip() for mode in self.speedup_modes.split(",") if mode.strip()]

    @property
    def is_speedup_check(self) -> bool:
        return bool(self.speedup_modes)

    def _check_multi_process(self) -> None:
        """Combinations that cannot mean anything, whatever the machine (its limits are
        checked by engine.admission.check_runnable)."""
        if self.nprocs == 1 and self.comm_hook != CommHook.NONE.value:
            raise ConfigError("comm_hook", self.comm_hook,
                              "gradient communication needs several processes; set nprocs "
                              "to 2 or more, or comm_hook to none")
        if self.nprocs == 1 and self.sharding != Sharding.DDP.value:
            raise ConfigError("sharding", self.sharding,
                              "fsdp2 shards the model across processes; set nprocs to 2 or "
                              "more, or sharding to ddp")
        if self.sharding == Sharding.FSDP2.value and self.precision == Precision.FP8.value:
            raise ConfigError("sharding", self.sharding,
                              "fp8 runs with ddp only here (torchao's float8 layers need their "
                              "own FSDP2 all-gather setup); use sharding ddp")
        if self.sharding == Sharding.FSDP2.value and self.numerics:
            raise ConfigError("numerics", self.numerics,
                              "the numerics probe reads each layer's whole gradient, which "
                              "fsdp2 shards across processes; use sharding ddp or turn "
                              "numerics off")

    def _coerce_enums(self) -> None:
        for field_name, enum_type, noun in (
            ("model", ModelName, "model"),
            ("size", ModelSize, "size"),
            ("precision", Precision, "precision"),
            ("optimizer", OptimizerName, "optimizer"),
            ("sharding", Sharding, "sharding"),
            ("comm_hook", CommHook, "communication hook"),
            ("data", DataMode, "data mode"),
        ):
            value = getattr(self, field_name)
            if isinstance(value, Enum):
                value = value.value
            if value not in choices(enum_type):
                raise ConfigError(field_name, value,
                                  f"unknown {noun}; choose one of {', '.join(choices(enum_type))}")
            # frozen dataclass: a plain string given by a caller becomes the enum member.
            object.__setattr__(self, field_name, enum_type(value))

    # -- convenience views -------------------------------------------------------------
    @property
    def precision_mode(self) -> Precision:
        return self.precision

    @property
    def uses_grad_scaler(self) -> bool:
        return self.precision == Precision.FP16_AMP.value and self.loss_scaling

    @property
    def label(self) -> str:
        procs = f" x{self.nprocs} procs" if self.nprocs > 1 else ""
        data = f" workers{self.num_workers}" if self.data == DataMode.LOADER.value else ""
        if self.is_speedup_check and not self.name:
            return (f"speedup check {self.model_label} bs{self.batch_size}: "
                    f"{' vs '.join(self.speedup_mode_list)}")
        return self.name or (f"{self.model_label} {self.precision} bs{self.batch_size}"
                             f"{procs}{data}")

    @property
    def unused_loader_options(self) -> list[str]:
        """DataLoader options set that this config never uses (synthetic data made on the
        device, or persistent workers without workers): warned about, not refused."""
        unused = []
        if self.data == DataMode.SYNTHETIC.value and self.model != ModelName.CUSTOM.value:
            unused = [name for name, off in (("num_workers", 0), ("pin_memory", False),
                                             ("persistent_workers", False))
                      if getattr(self, name) != off]
        if self.persistent_workers and self.num_workers == 0 and "persistent_workers" not in unused:
            unused.append("persistent_workers")
        return unused

    @property
    def model_label(self) -> str:
        """mlp-tiny, torchvision:resnet50, or the custom workload's file/function name."""
        if self.model == ModelName.CUSTOM.value:
            return "custom:" + self.workload.replace("\\", "/").rsplit("/", 1)[-1]
        if self.model.value in ARCHITECTURES:
            return self.model.value
        return f"{self.model}-{self.size}"

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    # -- JSON round trip ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types: enum members as their string values."""
        return {key: value.value if isinstance(value, Enum) else value
                for key, value in dataclasses.asdict(self).items()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        if not isinstance(data, dict):
            raise ConfigError("config", type(data).__name__, "a JSON object of RunConfig fields")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(unknown[0], data[unknown[0]],
                              f"unknown field; known fields are {', '.join(sorted(known))}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> "RunConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError("config", text[:40], f"not valid JSON ({exc.msg})") from None
        return cls.from_dict(data)


def config_fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(RunConfig))


def field_doc(field_name: str) -> str:
    """The docstring written under a field, for UI help texts."""
    return _field_docs().get(field_name, "")


def _check_int(cfg: RunConfig, name: str, low: int, high: int, fix: str) -> None:
    value = getattr(cfg, name)
    # bool is an int subclass; True as a batch size is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, value, f"a whole number; expected {fix}")
    if not low <= value <= high:
        raise ConfigError(name, value, f"out of range [{low}, {high}]; expected {fix}")


def _check_float(cfg: RunConfig, name: str, low: float, high: float, fix: str,
                 open_low: bool = False) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(name, value, f"a number; expected {fix}")
    try:
        value = float(value)
    except OverflowError:  # an int too large for a float
        raise ConfigError(name, value, f"out of range; expected {fix}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ConfigError(name, value, f"a finite number; expected {fix}")
    too_low = value <= low if open_low else value < low
    if too_low or value > high:
        raise ConfigError(name, value, f"out of range; expected {fix}")
    object.__setattr__(cfg, name, value)


@functools.cache
def _field_docs() -> dict[str, str]:
    """Read the per-field docstrings from this module's source (kept next to the fields).

    Parsed on the first call, not at import: the parse is ~25 ms, and every process
    imports this module (a run's supervisor before its trainer starts, the CLI) while
    only the Launch page's help texts read the docs."""
    import ast
    import inspect

    try:
        tree = ast.parse(inspect.getsource(RunConfig))
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, following in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(getattr(following, "value", None), ast.Constant)
                and isinstance(following.value.value, str)):
            docs[node.target.id] = following.value.value
    return docs


__all__ = [
    "ConfigError", "DataMode", "Precision", "ModelName", "ModelSize", "OptimizerName", "RunConfig",
    "Sharding", "CommHook", "MAX_NPROCS",
    "PRECISION_LABELS", "choices", "config_fields", "field_doc",
]
