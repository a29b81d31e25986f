"""Ready-made sets of runs, and the one way to start several runs: all or none.

- the comparison preset: one workload at fp32, fp16-amp and bf16-amp, queued in turn on
  one device so their numbers are fair (Launch page);
- the input-pipeline what-if: one workload at one precision through the DataLoader with
  0, 2 and 4 worker processes (how much of each step waits for data);
- the numerics demo: a tiny MLP whose activation gradients fall below fp16's range as
  it learns, run as fp16 without loss scaling, fp16-amp and bf16-amp (Compare page);
- `launch_many`: every config is checked against this machine first, so a preset or a
  local sweep launches all of its runs or none.
"""

from __future__ import annotations

from typing import Callable, Iterable

from engine.admission import check_runnable
from engine.config import DataMode, Precision, RunConfig
from engine.run.launcher import launch
from engine.store import Store

COMPARISON_PRESET = (Precision.FP32.value, Precision.FP16_AMP.value, Precision.BF16_AMP.value)
INPUT_PIPELINE_WORKERS = (0, 2, 4)  # DataLoader worker processes of the what-if's runs

# The demo: batch 512 and lr 1e-2 make it converge within 60 steps; confident predictions
# have tiny gradients. Measured on a CPU with the numerics probe: at steps 30 and 60 about
# 37 % of the activation gradients were exact zeros in fp16 without loss scaling, about
# 9 % with the GradScaler (scale 65536), 0.02 % in bf16 (0.5 % at step 1). The final
# losses agreed within noise: on a model this small, with AdamW, the gradients that vanish
# are the ones that barely mattered.
NUMERICS_DEMO_BASE = RunConfig(model="mlp", size="tiny", batch_size=512, lr=0.01, steps=60)
NUMERICS_DEMO_VARIANTS = (  # (precision, loss_scaling, label); the first is the baseline
    ("fp16-amp", True, "demo fp16-amp (loss scaling)"),
    ("fp16-amp", False, "demo fp16 without loss scaling"),
    ("bf16-amp", True, "demo bf16-amp"),
)


def comparison_configs(base: RunConfig) -> list[RunConfig]:
    """`base` at each precision of the comparison preset."""
    return [base.replace(precision=precision) for precision in COMPARISON_PRESET]


def input_pipeline_configs(base: RunConfig) -> list[RunConfig]:
    """`base` (its model and precision) through the DataLoader with 0, 2 and 4 workers:
    persistent, so a pass over the data does not restart them; the rest of base's
    loader options (pin_memory, prefetch_factor) as given."""
    return [base.replace(data=DataMode.LOADER.value, num_workers=workers,
                         persistent_workers=workers > 0)
            for workers in INPUT_PIPELINE_WORKERS]


def numerics_demo_configs() -> list[RunConfig]:
    """The demo runs, with the numerics probe on."""
    return [NUMERICS_DEMO_BASE.replace(precision=precision, loss_scaling=scaling, name=label,
                                       numerics=True)
            for precision, scaling, label in NUMERICS_DEMO_VARIANTS]


def check_all(configs: Iterable[RunConfig]) -> list[RunConfig]:
    """Raise the first ConfigError any config meets on this machine; else the configs."""
    configs = list(configs)
    for cfg in configs:
        check_runnable(cfg)
    return configs


def launch_many(configs: Iterable[RunConfig], store: Store | None = None,
                on_launched: Callable[[int, str], None] | None = None) -> list[str]:
    """Check every config, then launch each (queued in turn on its device); the run ids.

    A ConfigError from any config launches nothing. `on_launched(position, run_id)` is
    called after each launch (a sweep links its runs with it).
    """
    store = store or Store()
    run_ids = []
    for position, cfg in enumerate(check_all(configs)):
        run_id = launch(cfg, store)
        if on_launched is not None:
            on_launched(position, run_id)
        run_ids.append(run_id)
    return run_ids
