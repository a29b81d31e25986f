"""Realistic metric rows, and a store of N finished runs x M steps for the read benchmarks.

The big store (20 runs x 100k steps = 2M metric rows, ~300 MB) takes ~30 s to build on
a 2-core box, so it is built once into a cache folder under the system temp directory
and reused by later benchmark runs (bench.store, bench.ui); `build_info.json` in it says
how and when it was built. It is built through `Store.write_metrics` itself, in batches
of 20 000 rows, so its layout is exactly what workers produce.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

DATASET_VERSION = 3  # 3: finished runs carry compare stats
BATCH_ROWS = 20_000
TELEMETRY_HZ = 2.0
PRECISIONS = ("fp32", "bf16-amp", "fp16-amp", "bf16-pure")


def default_cache_root() -> Path:
    return Path(tempfile.gettempdir()) / "precision_lab_bench"


def metric_columns(start_step: int, count: int, rng: np.random.Generator,
                   precision: str = "fp32", model: str = "gpt", step_ms: float = 10.0,
                   warmup_steps: int = 3) -> dict[str, list]:
    """Columns of `count` metric rows from `start_step`, shaped like a CPU run's rows:
    a falling noisy loss with rare spikes, steady throughput with jitter, CPU memory
    (no CUDA fields), a loss scale only for fp16-amp."""
    steps = np.arange(start_step, start_step + count)
    loss = 5.5 * np.exp(-steps / 15_000.0) + 0.3 + 0.05 * rng.standard_normal(count)
    spikes = rng.random(count) < 1e-4
    loss[spikes] *= 3.0
    step_time_ms = step_ms * (1.0 + 0.05 * rng.standard_normal(count)).clip(0.5)
    samples_per_s = 16 * 1000.0 / step_time_ms
    achieved_tflops = 2.2e9 * samples_per_s / 16 / 1e12
    phase = np.where(steps <= warmup_steps, "warmup", "steady")
    fp16 = precision == "fp16-amp"
    return {
        "step": steps.tolist(),
        "wall_time_s": (steps * step_ms / 1000.0).tolist(),
        "loss": loss.tolist(),
        "lr": [3e-3] * count,
        "step_time_ms": step_time_ms.tolist(),
        "samples_per_s": samples_per_s.tolist(),
        "tokens_per_s": (samples_per_s * 64).tolist() if model == "gpt" else [None] * count,
        "mem_allocated_bytes": [None] * count,
        "mem_reserved_bytes": [None] * count,
        "mem_peak_bytes": [412_000_000] * count,
        "rss_bytes": (400_000_000 + rng.integers(0, 1_000_000, count)).tolist(),
        "loss_scale": [65536.0] * count if fp16 else [None] * count,
        "skipped_steps": [0] * count,
        "grad_norm": (0.5 + 0.1 * rng.standard_normal(count)).tolist(),
        "achieved_tflops": achieved_tflops.tolist(),
        "mfu": (achieved_tflops / 0.2).tolist(),
        "phase": phase.tolist(),
    }


def metric_rows(start_step: int, count: int, rng: np.random.Generator, **kwargs) -> list[dict]:
    """The same as dicts, the form `emit()` and `Store.write_metrics` take."""
    columns = metric_columns(start_step, count, rng, **kwargs)
    names = list(columns)
    return [dict(zip(names, values)) for values in zip(*columns.values())]


def telemetry_rows(start_t_s: float, count: int, rng: np.random.Generator) -> list[dict]:
    t = start_t_s + np.arange(count) / TELEMETRY_HZ
    cpu = (180.0 + 10.0 * rng.standard_normal(count)).clip(0)
    rss = 400_000_000 + rng.integers(0, 1_000_000, count)
    return [{"t_s": float(a), "cpu_pct": float(b), "rss_bytes": int(c)}
            for a, b, c in zip(t, cpu, rss)]


def run_config(index: int):
    from engine.config import RunConfig

    precision = PRECISIONS[index % len(PRECISIONS)]
    return RunConfig(model="gpt", size="tiny", precision=precision, batch_size=16,
                     steps=100_000, profile=False, seed=index // len(PRECISIONS),
                     name=f"bench {precision} {index}")


def build_store(home: Path, runs: int, steps: int, seed: int = 0) -> list[str]:
    """Fill a new store at `home` with `runs` finished runs of `steps` logged steps."""
    from engine.run.finalize import finalize_run_data
    from engine.schema import FINISHED, RUNNING
    from engine.store import Store

    store = Store(home)
    rng = np.random.default_rng(seed)
    run_ids = []
    for index in range(runs):
        cfg = run_config(index).replace(steps=steps)
        run_id = store.create_run(cfg, "cpu", "bench CPU", run_id=f"bench-{index:03d}")
        store.set_status(run_id, RUNNING)
        step_ms = 10.0 * (1.0 + 0.1 * (index % len(PRECISIONS)))
        for start in range(1, steps + 1, BATCH_ROWS):
            count = min(BATCH_ROWS, steps - start + 1)
            store.write_metrics(run_id, metric_rows(start, count, rng,
                                                    precision=cfg.precision, step_ms=step_ms))
        duration_s = steps * step_ms / 1000.0
        store.write_telemetry(run_id, telemetry_rows(time.time() - duration_s,
                                                     int(duration_s * TELEMETRY_HZ), rng))
        samples_per_s = 16 * 1000.0 / step_ms
        store.merge_summary(run_id, {
            "status": "finished", "steps_completed": steps, "first_loss": 5.8,
            "final_loss": 0.31, "samples_per_s": samples_per_s,
            "tokens_per_s": samples_per_s * 64, "step_time_ms": step_ms,
            "peak_mem_bytes": 412_000_000, "param_count": 120_000, "skipped_steps": 0,
            "flops_per_step": 2.2e9, "achieved_tflops": 2.2e9 * 1000.0 / step_ms / 1e12,
            "loss_scale_final": 65536.0 if cfg.precision == "fp16-amp" else None})
        finalize_run_data(store, run_id)  # as the worker does when a run ends
        store.set_status(run_id, FINISHED)
        run_ids.append(run_id)
    return run_ids


def cached_store(runs: int, steps: int, cache_root: Path | None = None) -> tuple[Path, dict]:
    """(home, build_info) of a store with `runs` x `steps`, built now or reused."""
    root = Path(cache_root) if cache_root else default_cache_root()
    home = root / f"store_{runs}x{steps}_v{DATASET_VERSION}"
    info_path = home / "build_info.json"
    if info_path.exists():
        info = json.loads(info_path.read_text())
        info["reused"] = True
        return home, info
    root.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f"building_{runs}x{steps}_", dir=root))
    try:
        start = time.perf_counter()
        run_ids = build_store(building, runs, steps)
        build_s = time.perf_counter() - start
        info = {"runs": runs, "steps_per_run": steps, "metric_rows": runs * steps,
                "run_ids": run_ids, "build_s": build_s, "built_at": time.time(),
                "method": f"Store.write_metrics in batches of {BATCH_ROWS} rows, plus "
                          f"{TELEMETRY_HZ:g} Hz telemetry rows; cached under {root}",
                "db_bytes": _db_bytes(building)}
        (building / "build_info.json").write_text(json.dumps(info, indent=1))
        try:
            os.rename(building, home)  # atomic: a killed build never looks finished
        except OSError:  # built meanwhile by another process: use theirs
            shutil.rmtree(building, ignore_errors=True)
            return cached_store(runs, steps, cache_root)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    info["reused"] = False
    return home, info


def _db_bytes(home: Path) -> int:
    return sum(p.stat().st_size for p in home.glob("precision_lab.sqlite3*"))


def describe(info: dict[str, Any]) -> str:
    how = "reused from cache" if info.get("reused") else "built now"
    return (f"{info['runs']} runs x {info['steps_per_run']:,} steps "
            f"({info['metric_rows']:,} metric rows, {info.get('db_bytes', 0) / 1e6:,.0f} MB), "
            f"{how}; built in {info['build_s']:.1f} s by {info['method']}")
