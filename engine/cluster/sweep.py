"""Sweeps: a grid of runs (models x precisions x batch sizes, common settings shared),
executed on this machine's device queue or on a Ray cluster, and the results matrix.

Every run of a sweep is an ordinary run in the store (create_run with its RunConfig), so
the Live, Runs and Compare pages show sweep runs like any other; `sweep_runs` links them.

- local backend: each run is started with `engine.run.launcher.launch`; the store's FIFO,
  one-run-per-device queue runs them one after another.
- ray backend: the runs are recorded as queued and one driver process
  (`python -m engine.cluster.ray_driver SWEEP_ID`, see engine/cluster/ray_driver.py) submits them
  as Ray
  tasks and writes their results back into this store.

Imports neither ray (only the driver process does) nor torch at module level: the CLI
and the pages load it cheaply.
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from engine.cluster.ray_env import RayOptions, ray_problem, validate_ray_address
from engine.config import (
    MAX_BATCH_SIZE,
    ConfigError,
    ModelName,
    ModelSize,
    Precision,
    RunConfig,
    choices,
)
from engine.display import GIB, interval_text, loss_text, memory_text, ratio_text, throughput_text
from engine.presets import check_all, launch_many
from engine.proc import PROJECT_ROOT, process_create_time, reap_when_done
from engine.run.launcher import reconcile, stop
from engine.run.ray_runs import request_ray_stops, wait_ray_runs_ended
from engine.schema import (
    DRIVER_LOG,
    FINISHED,
    QUEUED,
    SWEEP_DONE,
    SWEEP_FAILED,
    SWEEP_LOCAL,
    SWEEP_RAY,
    SWEEP_RUNNING,
)
from engine.store import RunRecord, Store, SweepRecord

# Every local run holds a waiting supervisor process until its turn, and a sweep is for
# answering one question: past this many runs, split the question.
MAX_SWEEP_RUNS = 48

# Results matrix metrics: key -> (label, unit).
MATRIX_METRICS = {
    "throughput_x": ("throughput vs the baseline precision", "x"),
    "samples_per_s": ("throughput", "samples/s"),
    "peak_mem_gib": ("peak memory", "GiB"),
    "final_loss": ("final loss", ""),
}


# ---------------------------------------------------------------------------------------
# the grid


@dataclass(frozen=True)
class SweepGrid:
    """The runs of a sweep: every combination of models x precisions x batch sizes, with
    the remaining RunConfig settings shared."""

    models: tuple[str, ...] = (ModelName.MLP.value,)
    precisions: tuple[str, ...] = (Precision.FP32.value,)
    batch_sizes: tuple[int, ...] = (16,)
    size: str = ModelSize.TINY.value
    """tiny | small | medium, for every model."""
    steps: int = 30
    """Optimizer steps per run."""
    device: str = "auto"
    """Local backend: auto | cpu | cuda | cuda:N. The ray backend lets Ray place each run."""
    profile: bool = True
    """Profile a short window per run (kernel breakdown, Tensor-Core / CPU evidence)."""
    workload: str = ""
    """The custom model's workload (file path or module:function), when models has custom."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", _enum_list("models", self.models, ModelName, "model"))
        object.__setattr__(self, "precisions",
                           _enum_list("precisions", self.precisions, Precision, "precision"))
        object.__setattr__(self, "batch_sizes", _batch_list(self.batch_sizes))
        if self.run_count > MAX_SWEEP_RUNS:
            raise ConfigError(
                "grid", f"{len(self.models)} x {len(self.precisions)} x {len(self.batch_sizes)}",
                f"models x precisions x batch_sizes = {self.run_count} runs, more than the "
                f"{MAX_SWEEP_RUNS} one sweep may create; drop some values or split the grid "
                "into several sweeps")
        self.configs()  # size, steps, device: RunConfig's own checks name the field

    @property
    def run_count(self) -> int:
        return len(self.models) * len(self.precisions) * len(self.batch_sizes)

    def configs(self) -> list[RunConfig]:
        """One RunConfig per grid point, models outermost, batch sizes innermost."""
        return [RunConfig(model=model, size=self.size, precision=precision, batch_size=batch,
                          steps=self.steps, device=self.device, profile=self.profile,
                          workload=self.workload if model == ModelName.CUSTOM.value else "")
                for model, precision, batch in itertools.product(
                    self.models, self.precisions, self.batch_sizes)]

    def to_dict(self) -> dict[str, Any]:
        return {key: list(value) if isinstance(value, tuple) else value
                for key, value in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SweepGrid":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: tuple(v) if isinstance(v, list) else v
                      for k, v in data.items() if k in known})


def _split(value: str | Iterable) -> list:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return list(value)


def _enum_list(name: str, values, enum_type, noun: str) -> tuple[str, ...]:
    items = [v.value if hasattr(v, "value") else v for v in _split(values)]
    if not items:
        raise ConfigError(name, values, f"choose at least one {noun}: "
                                        f"{', '.join(choices(enum_type))}")
    for item in items:
        if item not in choices(enum_type):
            raise ConfigError(name, item, f"unknown {noun}; choose from "
                                          f"{', '.join(choices(enum_type))}")
    return tuple(dict.fromkeys(items))  # duplicates would only repeat a run


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """"8, 16, 48" -> (8, 16, 48): the Sweep page's batch-size input, checked like the CLI's
    --batch-sizes (ConfigError naming the bad entry and the allowed range)."""
    return _batch_list(text)


def _batch_list(values) -> tuple[int, ...]:
    items = _split(values)
    if not items:
        raise ConfigError("batch_sizes", values, "give at least one batch size, e.g. 8,16")
    sizes = []
    for item in items:
        try:
            size = int(item) if not isinstance(item, bool) else None
        except (TypeError, ValueError):
            size = None
        if size is None or str(item).strip() != str(size) or not 1 <= size <= MAX_BATCH_SIZE:
            raise ConfigError("batch_sizes", item, f"a whole number in [1, {MAX_BATCH_SIZE}] "
                                                   "per batch size, e.g. 8,16,32")
        sizes.append(size)
    return tuple(dict.fromkeys(sizes))


# ---------------------------------------------------------------------------------------
# creating and stopping sweeps


def create_sweep(grid: SweepGrid, store: Store | None = None, ray_address: str = "",
                 ray_options: RayOptions | None = None) -> str:
    """Record the sweep and start its runs; return the sweep id.

    Everything is checked before anything is recorded: a bad grid creates no run.
    """
    store = store or Store()
    if ray_address:
        return _create_ray_sweep(grid, store, validate_ray_address(ray_address),
                                 ray_options or RayOptions())
    return _create_local_sweep(grid, store)


def _create_local_sweep(grid: SweepGrid, store: Store) -> str:
    # A mode this device cannot run: ConfigError naming precision, before the sweep exists.
    configs = check_all(grid.configs())
    sweep_id = store.create_sweep(grid.to_dict(), SWEEP_LOCAL)
    launch_many(configs, store, on_launched=lambda position, run_id: store.link_sweep_run(
        sweep_id, run_id, position))
    return sweep_id


def _create_ray_sweep(grid: SweepGrid, store: Store, address: str, options: RayOptions) -> str:
    problem = ray_problem(address)
    if problem:
        raise ConfigError("ray_address", address, problem)
    sweep_id = store.create_sweep(grid.to_dict(), SWEEP_RAY, address, asdict(options))
    for position, cfg in enumerate(grid.configs()):
        # Placed later by Ray: "ray" never matches a local device key, so these runs
        # neither wait in nor block this machine's device queues.
        run_id = store.create_run(cfg, "ray", f"Ray cluster at {address}: waiting for a node")
        store.link_sweep_run(sweep_id, run_id, position)
    start_driver(sweep_id, store)
    return sweep_id


def driver_log_path(store: Store, sweep_id: str):
    path = store.home / "sweeps" / sweep_id
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path / DRIVER_LOG


def start_driver(sweep_id: str, store: Store) -> int:
    """`python -m engine.cluster.ray_driver SWEEP_ID` in its own session (like a run's worker);
    its pid becomes the pid of every run of the sweep, so reconcile notices its death."""
    env = dict(os.environ)
    env["PRECISION_LAB_HOME"] = str(store.home)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    with open(driver_log_path(store, sweep_id), "ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "engine.cluster.ray_driver",
                sweep_id,
            ],  # an argument list: no shell
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(PROJECT_ROOT),
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    reap_when_done(proc, "ray-driver")
    created = process_create_time(proc.pid)
    store.set_sweep_driver(sweep_id, proc.pid, created)
    for run_id in store.get_sweep(sweep_id).run_ids:
        store.update_run(run_id, pid=proc.pid, pid_create_time=created)
    return proc.pid


def stop_sweep(sweep_id: str, store: Store | None = None) -> list[RunRecord]:
    """Stop every active run of the sweep; return the runs as they are afterwards."""
    store = store or Store()
    sweep = store.get_sweep(sweep_id)
    if sweep.backend == SWEEP_RAY:
        # Ask for all stops first, then wait once: the driver stops them in parallel.
        pending = request_ray_stops(store, sweep.run_ids)
        wait_ray_runs_ended(store, sweep, pending)
    else:
        # Queued ones first, so none of them grabs the device when the running one ends.
        runs = [store.get_run(run_id) for run_id in sweep.run_ids]
        for run in sorted(runs, key=lambda r: r.status != QUEUED):
            if run.is_active:
                stop(run.id, store)
    return [store.get_run(run_id) for run_id in sweep.run_ids]


# ---------------------------------------------------------------------------------------
# reading a sweep


@dataclass
class SweepView:
    sweep: SweepRecord
    grid: SweepGrid
    runs: list[RunRecord]
    status: str
    counts: dict[str, int] = field(default_factory=dict)


def sweep_view(store: Store, sweep_id: str) -> SweepView:
    sweep = store.get_sweep(sweep_id)
    runs = [store.get_run(run_id) for run_id in sweep.run_ids]
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.status] = counts.get(run.status, 0) + 1
    return SweepView(sweep, SweepGrid.from_dict(sweep.grid), runs,
                     sweep_status(sweep, runs), counts)


def sweep_status(sweep: SweepRecord, runs: list[RunRecord]) -> str:
    """running while any run is active; failed when the sweep itself failed (e.g. the
    Ray cluster was unreachable); done otherwise (each run keeps its own status)."""
    if any(run.is_active for run in runs):
        return SWEEP_RUNNING
    return SWEEP_FAILED if sweep.status == SWEEP_FAILED else SWEEP_DONE


def counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no runs"


def baseline_precision(precisions: Iterable[str]) -> str:
    precisions = list(precisions)
    return Precision.FP32.value if Precision.FP32.value in precisions else precisions[0]


# A results matrix's frames per model: name -> dtype. "absolute" is the figure behind a
# ratio (throughput_x: samples/s); "notes" what the ratio's text may claim (_ratio_note).
_CELL_FRAMES = {"values": float, "status": object, "absolute": float, "notes": object,
                "claims": object, "interval_low": float, "interval_high": float}

# What a throughput ratio may claim. The Sweep page colours only the baseline and
# significant ratios by value: a busy or inconclusive one is drawn grey, so a 16.54x
# measured while the machine was busy never looks like a result.
RATIO_BASELINE, RATIO_BUSY = "baseline", "busy"
RATIO_INCONCLUSIVE, RATIO_SIGNIFICANT = "inconclusive", "significant"
UNCLAIMED_RATIOS = (RATIO_BUSY, RATIO_INCONCLUSIVE)


def results_matrix(view: SweepView, metric: str) -> dict[str, Any]:
    """model -> DataFrame (rows: precision, columns: batch size) of `metric` over the
    sweep's finished runs; NaN where a run did not finish (its status is in `status`).

    Returns {"values": {model: frame}, "status": {model: frame of run status}, ...}.
    throughput_x divides each run's steady-state samples/s by the baseline precision's
    (fp32 when in the grid, else the first precision) at the same model and batch size;
    "claims", "interval_low" and "interval_high" then say what each ratio may claim.
    """
    import pandas as pd

    if metric not in MATRIX_METRICS:
        raise ConfigError("metric", metric, f"choose one of {', '.join(MATRIX_METRICS)}")
    grid = view.grid
    baseline = baseline_precision(grid.precisions)
    cells = {(r.config.model, r.config.precision, r.config.batch_size): r for r in view.runs}
    matrix: dict[str, Any] = {name: {} for name in _CELL_FRAMES}
    for model in grid.models:
        frames = {name: pd.DataFrame(index=list(grid.precisions), columns=list(grid.batch_sizes),
                                     dtype=dtype) for name, dtype in _CELL_FRAMES.items()}
        for precision, batch in itertools.product(grid.precisions, grid.batch_sizes):
            cell = _matrix_cell(cells.get((model, precision, batch)),
                                cells.get((model, baseline, batch)), metric, precision == baseline)
            for name, value in cell.items():
                frames[name].loc[precision, batch] = value
        frames["values"].index.name, frames["values"].columns.name = "precision", "batch size"
        for name, frame in frames.items():
            matrix[name][model] = frame
    label, unit = MATRIX_METRICS[metric]
    matrix.update(baseline=baseline, metric=metric, label=label, unit=unit)
    return matrix


def _matrix_cell(run: RunRecord | None, base: RunRecord | None, metric: str,
                 is_baseline: bool) -> dict[str, Any]:
    """One grid point's entries in every frame of the results matrix."""
    value = _cell_value(run, base, metric)
    cell = {"values": value, "status": run.status if run else "missing", "absolute": value,
            "notes": "", "claims": "", "interval_low": math.nan, "interval_high": math.nan}
    if metric != "throughput_x":
        return cell
    cell["absolute"] = _cell_value(run, None, "samples_per_s")
    if is_baseline:
        cell["claims"] = RATIO_BASELINE if _finite(value) is not None else ""
        return cell
    claim, low, high = _ratio_evidence(run, base, value)
    cell.update(notes=_ratio_note(claim, low, high), claims=claim, interval_low=low,
                interval_high=high)
    return cell


def _ratio_evidence(run: RunRecord | None, base: RunRecord | None,
                    ratio: float) -> tuple[str, float, float]:
    """What a throughput ratio may claim, with its 95 % interval (NaN, NaN when the runs
    have too few steady steps for one): busy when either run was measured on a busy
    machine, whatever the interval says; significant when the interval excludes 1.0;
    else inconclusive. ("", NaN, NaN) when there is no ratio."""
    # the interval uses numpy (the Sweep page and CLI only): not at module level
    from engine.analysis.compare import unpaired_ratio_interval
    from engine.analysis.steady import COMPARE_STATS_KEY  # the same: steady imports pandas

    if _finite(ratio) is None or run is None or base is None:
        return "", math.nan, math.nan
    samples = [(r.summary.get(COMPARE_STATS_KEY) or {}).get("steady_step_ms") or []
               for r in (base, run)]
    interval = unpaired_ratio_interval(*samples)
    low = high = math.nan
    if interval is not None:
        # The interval is of the step-time ratio; scaled to throughput (a batch that
        # differs changes work per step, not the relative spread).
        step_ratio = statistics.median(samples[0]) / statistics.median(samples[1])
        low, high = (bound * ratio / step_ratio for bound in interval)
    if any((r.summary.get("contention") or {}).get("busy") for r in (run, base)):
        return RATIO_BUSY, low, high
    # NaN bounds compare False: no interval is inconclusive, never significant.
    return (RATIO_SIGNIFICANT if low > 1.0 or high < 1.0 else RATIO_INCONCLUSIVE), low, high


def _ratio_note(claim: str, low: float, high: float) -> str:
    """The few characters a ratio's text carries: "busy", its interval ("[1.18-1.29]") when
    significant, "n.s." when inconclusive (the word the CLI and README use)."""
    if claim == RATIO_SIGNIFICANT:
        return f"[{low:.2f}-{high:.2f}]"
    return {RATIO_BUSY: "busy", RATIO_INCONCLUSIVE: "n.s."}.get(claim, "")


# A ratio's claim as the hover spells it out.
_CLAIM_WORDS = {
    RATIO_BASELINE: "baseline",
    RATIO_BUSY: "busy: measured on a busy machine, not a speedup figure",
    RATIO_INCONCLUSIVE: "inconclusive: not shown to differ from 1x",
    RATIO_SIGNIFICANT: "significant: the interval excludes 1x",
}


def ratio_claim(matrix: dict[str, Any], model: str, precision: str, batch: int) -> str:
    """The cell's claim (RATIO_*), "" where it has no ratio or the metric is no ratio."""
    return _entry(matrix, "claims", model, precision, batch) or ""


def _entry(matrix: dict[str, Any], name: str, model: str, precision: str, batch: int):
    """One cell of one of the matrix's frames; None where the matrix has no such frame."""
    frame = matrix.get(name, {}).get(model)
    return frame.loc[precision, batch] if frame is not None else None


def cell_hover(matrix: dict[str, Any], model: str, precision: str,
               batch: int) -> tuple[str, str, str]:
    """A heatmap cell's hover as plain text: its value, for a ratio its 95 % interval
    ("" otherwise), and its status (a ratio's claim, else the run's status)."""
    value = matrix["values"][model].loc[precision, batch]
    status = matrix["status"][model].loc[precision, batch]
    ratio = matrix["metric"] == "throughput_x"
    if _finite(value) is None:
        return "no value", "no interval" if ratio else "", status
    if not ratio:
        return _metric_text(value, matrix["metric"], matrix["unit"]), "", status
    own = matrix["absolute"][model].loc[precision, batch]
    shown = ratio_text(value) + (f" ({throughput_text(own, 'samples/s')})"
                                 if _finite(own) is not None else "")
    claim = ratio_claim(matrix, model, precision, batch)
    low, high = (_finite(_entry(matrix, name, model, precision, batch))
                 for name in ("interval_low", "interval_high"))
    if claim == RATIO_BASELINE:
        interval = "the baseline: 1x by definition"
    elif low is None or high is None:
        interval = "no interval (too few steady steps)"
    else:
        interval = f"95 % interval {interval_text(low, high)}"
    return shown, interval, _CLAIM_WORDS.get(claim, status)


def cell_label(matrix: dict[str, Any], model: str, precision: str, batch: int) -> str:
    """A heatmap cell's text: the value with its unit, and for a ratio the absolute figure
    under it ("1.23x" / "4,567 samples/s"); the run's status where it has no value."""
    value = matrix["values"][model].loc[precision, batch]
    status = matrix["status"][model].loc[precision, batch]
    own = matrix["absolute"][model].loc[precision, batch]
    if matrix["metric"] == "throughput_x":
        note = matrix.get("notes", {}).get(model)
        note = note.loc[precision, batch] if note is not None else ""
        ratio = ratio_text(value) if _finite(value) is not None else (
            "n/a" if status == FINISHED else status)
        ratio += f" {note}" if note and _finite(value) is not None else ""
        # The absolute figure stays even when the ratio has no baseline to divide by.
        return ratio + (f"<br>{throughput_text(own, 'samples/s')}"
                        if _finite(own) is not None else "")
    if _finite(value) is None:
        return "n/a" if status == FINISHED else status
    return _metric_text(value, matrix["metric"], matrix["unit"])


def _metric_text(value: float, metric: str, unit: str) -> str:
    """A cell's figure as every other surface writes it (engine.display): memory by size
    (the matrix holds GiB), loss to four decimals, throughput to one, a ratio as "1.23x"."""
    if metric == "throughput_x":
        return ratio_text(value)
    if metric == "peak_mem_gib":
        return memory_text(value * GIB)
    if metric == "final_loss":
        return loss_text(value)
    return throughput_text(value, unit)


def _cell_value(run: RunRecord | None, base: RunRecord | None, metric: str) -> float:
    if run is None or run.status != FINISHED:
        return math.nan
    summary = run.summary
    if metric == "throughput_x":
        own = _finite(summary.get("samples_per_s"))
        ref = (
            _finite(base.summary.get("samples_per_s")) if base and base.status == FINISHED else None
        )
        return own / ref if own and ref else math.nan
    if metric == "peak_mem_gib":
        peak = _finite(summary.get("peak_mem_bytes"))
        return peak / 2**30 if peak else math.nan
    value = _finite(summary.get(metric))
    return value if value is not None else math.nan


def _finite(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def matrix_text(matrix: dict[str, Any]) -> str:
    """The results matrix as plain text: one block per model, n/a (status) where a run
    has no value."""
    unit = f" ({matrix['unit']})" if matrix["unit"] else ""
    lines = [f"{matrix['label']}{unit}" + (f", baseline {matrix['baseline']}"
                                             if matrix["metric"] == "throughput_x" else "")]
    for model, frame in matrix["values"].items():
        status = matrix["status"][model]
        header = [model] + [f"bs{b}" for b in frame.columns]
        notes = matrix.get("notes", {}).get(model)
        rows = [[precision] + [_cell_text(frame.loc[precision, b], status.loc[precision, b],
                                          matrix["metric"],
                                          notes.loc[precision, b] if notes is not None else "")
                               for b in frame.columns] for precision in frame.index]
        widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
        lines.append("")
        for row in [header] + rows:
            lines.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                                   for i, (cell, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)


def _cell_text(value: float, status: str, metric: str, note: str = "") -> str:
    if isinstance(value, float) and math.isfinite(value):
        if metric == "throughput_x":
            return ratio_text(value) + (f" {note}" if note else "")
        return _metric_text(value, metric, "")
    return "n/a" if status == FINISHED else f"n/a ({status})"


def wait_sweep(store: Store, sweep_id: str, timeout_s: float, poll_s: float = 0.5) -> SweepView:
    """Poll until no run of the sweep is active (or the timeout); the last view."""
    deadline = time.monotonic() + timeout_s
    while True:
        reconcile(store)
        view = sweep_view(store, sweep_id)
        if view.status != SWEEP_RUNNING or time.monotonic() >= deadline:
            return view
        time.sleep(poll_s)


__all__ = [
    "MATRIX_METRICS", "MAX_SWEEP_RUNS", "RATIO_BASELINE", "RATIO_BUSY",
    "RATIO_INCONCLUSIVE", "RATIO_SIGNIFICANT", "UNCLAIMED_RATIOS", "SweepGrid",
    "SweepView", "cell_hover", "cell_label", "create_sweep", "matrix_text", "ratio_claim",
    "results_matrix", "stop_sweep", "sweep_view",
    "wait_sweep",
]
