"""Plain-language findings over the compare table: which run is faster or slower than the
baseline and by how much (with its interval), memory, loss against the runs' own noise,
skipped steps, why a mode is slower, and what makes two runs not comparable.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import pandas as pd

from engine.analysis.compare import LOSS_NOISE_FLOOR_PCT, config_diff
from engine.analysis.cpu_evidence import SLOW_CPU_VERDICTS
from engine.analysis.numerics import numerics_findings
from engine.analysis.steady import BASIS_NON_WARMUP
from engine.config import Precision
from engine.display import (
    PROCESS_PEAK_NAME,
    TENSOR_PEAK_NAME,
    loss_text,
    memory_text,
    mfu_text,
    share_text,
    step_time_text,
    throughput_text,
)
from engine.schema import FINISHED
from engine.store import RunRecord

# Below these differences the findings say "about the same": a busy machine moves step
# times by a few per cent from run to run, and a process's peak RSS by a little.
SPEED_TOLERANCE = 0.05  # |throughput_x - 1| <= 5 %
MEMORY_TOLERANCE_PCT = 2.0
# Config fields that change the work a step does: when they differ, throughput and
# memory ratios compare different workloads, and the findings say so first.
# nprocs multiplies the global batch; sharding and comm_hook are choices to compare.
WORKLOAD_FIELDS = ("model", "size", "batch_size", "seq_len", "image_size", "device",
                   "channels_last", "compile", "nprocs")
TRAINING_FIELDS = ("steps", "lr", "optimizer", "weight_decay", "seed", "warmup_steps")


# ---------------------------------------------------------------------------------------
# findings


def findings(table: pd.DataFrame, runs: Mapping[str, RunRecord] | Iterable[RunRecord],
             run_dir=None) -> list[str]:
    """Plain-language statements, each backed by a number in `table`.

    Nothing is claimed that the table does not show: slower runs are called slower,
    Tensor Cores are mentioned only where a kernel breakdown measured them, and a loss
    difference is called real only beyond the runs' own step-to-step noise.
    """
    if table.empty:
        return []
    runs = dict(runs) if isinstance(runs, Mapping) else {r.id: r for r in runs}
    rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in table.to_dict("records")]
    base = next((r for r in rows if r["is_baseline"]), rows[0])
    underflow = numerics_findings([runs[r["run_id"]] for r in rows if r["run_id"] in runs],
                                  run_dir) if run_dir is not None else []
    if underflow and all(runs[r["run_id"]].config.numerics for r in rows if r["run_id"] in runs):
        # The numerics demo: its point is underflow with and without the loss scale. Its
        # runs do the same matmuls at sampled, deliberately slowed steps: no speed claims.
        return underflow + ["Speed is not compared here: these runs sample gradient "
                            "numerics, and their point is underflow. For what a precision "
                            "buys in speed, run a Speedup check (Launch page)."]
    statements = _comparability_notes(rows, runs)
    statements.append(_baseline_sentence(base, runs.get(base["run_id"])))
    for row in rows:
        if row["run_id"] != base["run_id"]:
            statements.append(_run_sentence(row, base, runs.get(row["run_id"])))
    statements += _closing_notes(rows, runs) + underflow
    return [s for s in statements if s]


def _comparability_notes(rows: list[dict[str, Any]], runs: Mapping[str, RunRecord]) -> list[str]:
    configs = {r["run_id"]: runs[r["run_id"]].config for r in rows if r["run_id"] in runs}
    if len(configs) < 2:
        return []
    diff = config_diff(configs)
    notes = []
    differing = [f for f in WORKLOAD_FIELDS if f in set(diff["field"])]
    if differing:
        detail = ", ".join(
            f"{f} ({', '.join(dict.fromkeys(diff.loc[diff['field'] == f].iloc[0, 1:]))})"
            for f in differing
        )
        notes.append(f"Caution: the runs differ in {detail}, so throughput and memory "
                     "compare different work, not only precisions.")
    training = [f for f in TRAINING_FIELDS if f in set(diff["field"])]
    if training:
        notes.append(f"The runs differ in {', '.join(training)}: their final losses compare "
                     "different training, not only precisions.")
    return notes


def _baseline_sentence(base: dict[str, Any], run: RunRecord | None) -> str:
    parts = []
    if base["throughput_per_s"] is not None:
        parts.append(throughput_text(base["throughput_per_s"], base["throughput_unit"]))
    if base["step_time_ms"] is not None:
        parts.append(f"{step_time_text(base['step_time_ms'])} per step")
    for key, name in (("tensor_peak_bytes", TENSOR_PEAK_NAME),
                      ("process_peak_bytes", PROCESS_PEAK_NAME)):
        if base.get(key) is not None:
            parts.append(f"{name} {memory_text(base[key])}")
    if base["final_loss"] is not None:
        parts.append(f"final loss {loss_text(base['final_loss'])}")
    if base["skipped_steps"]:
        parts.append(_skipped_text(base))
    text = f"Baseline {base['name']}: " + (", ".join(parts) if parts else "no steady-state numbers")
    return text + _status_suffix(base) + _basis_suffix(base) + "."


def _run_sentence(row: dict[str, Any], base: dict[str, Any], run: RunRecord | None) -> str:
    parts = [_speed_text(row, base), _memory_text(row, base), _loss_text(row, base)]
    if row["skipped_steps"]:
        parts.append(_skipped_text(row))
    if row["max_batch_fit"] and base["max_batch_fit"]:
        parts.append(f"largest batch that fitted {row['max_batch_fit']} "
                     f"(vs {base['max_batch_fit']})")
    if row["tensor_core_share"] is not None:  # only where a kernel breakdown measured it
        parts.append(f"{share_text(row['tensor_core_share'])} of GPU kernel time on Tensor Cores")
    if row["mfu"] is not None:
        parts.append(f"MFU {mfu_text(row['mfu'])}")
    text = f"{row['name']}: " + ", ".join(p for p in parts if p)
    text += _status_suffix(row) + _basis_suffix(row) + "."
    return text + _why_slower(row, run)


def peak_words(summary: Mapping[str, Any]) -> str:
    """What a run's MFU is relative to, in words every surface shows: the datasheet row or
    the measured peak with when and under what load (engine.hardware.peaks)."""
    label = summary.get("peak_label")
    if label:
        return label
    source = summary.get("peak_source")
    return f"{source} peak for this precision" if source else "peak: not known"


MFU_PEAK_NAMES = {
    "datasheet": "against the datasheet peak",
    "measured": "against the measured ceiling",
}


def both_mfu_words(summary: Mapping[str, Any]) -> str | None:
    """The run's MFU against both peaks, each named (the datasheet row or a CPU's ISA peak,
    and the measured matmul ceiling with when), as Live and the report say it."""
    peaks = summary.get("mfu_peaks")
    if not isinstance(peaks, Mapping) or "error" in peaks:
        return None
    parts = []
    for kind, name in MFU_PEAK_NAMES.items():
        entry = peaks.get(kind) or {}
        if entry.get("mfu") is not None:
            parts.append(f"{mfu_text(entry['mfu'])} {name} ({entry['label']})")
        elif entry.get("flops_per_s"):
            parts.append(f"n/a {name} ({entry.get('note') or entry['label']})")
        else:
            parts.append(f"n/a {name}: {entry.get('label') or 'none known'}")
    return "MFU " + "; ".join(parts)


def _speed_text(row: dict[str, Any], base: dict[str, Any]) -> str:
    """A speedup is stated only when its interval excludes 1.0 and neither run was
    measured on a busy machine; otherwise the sentence says why it is not."""
    x = row["throughput_x"]
    if x is None:
        return "no steady-state throughput to compare"
    busy = next((r for r in (row, base) if r.get("busy")), None)
    if busy is not None:
        return (f"throughput {x:.2f}x {base['name']}'s, not a speedup figure: "
                f"{busy['name']} was {busy['contention_words']}")
    low, high = row.get("throughput_x_low"), row.get("throughput_x_high")
    if low is None or high is None:
        return (f"throughput {x:.2f}x {base['name']}'s (too few steady steps for an "
                "interval: no speedup is stated)")
    interval = f"95 % interval {low:.2f}-{high:.2f}x"
    if not row.get("throughput_significant"):
        return f"no measurable difference in speed from {base['name']} ({low:.2f}-{high:.2f}x)"
    if x > 1.0:
        return f"{_fmt_x(x)} faster than {base['name']} ({interval})"
    return f"{_fmt_x(1.0 / x)} slower than {base['name']} ({x:.2f}x its throughput; {interval})"


def _memory_text(row: dict[str, Any], base: dict[str, Any]) -> str:
    saved = row["mem_saved_pct"]
    if saved is None:
        return ""
    basis = row.get("mem_saved_basis") or "peak memory"
    if abs(saved) < MEMORY_TOLERANCE_PCT:
        return f"about the same {basis} ({_fmt_pct(-saved, signed=True)} %)"
    if saved > 0:
        return f"{saved:.0f} % less memory ({basis})"
    return f"{-saved:.0f} % more memory ({basis})"


def _loss_text(row: dict[str, Any], base: dict[str, Any]) -> str:
    diff = row["final_loss_diff_pct"]
    if diff is None:
        return "no final loss to compare"
    tolerance = row["loss_tolerance_pct"] or LOSS_NOISE_FLOOR_PCT
    if tolerance <= LOSS_NOISE_FLOOR_PCT:
        noise = f"±{_fmt_pct(tolerance)} % minimum tolerance; the measured noise is smaller"
    else:
        noise = f"±{_fmt_pct(tolerance)} % {_NOISE_WORDS.get(row['loss_noise_basis'], 'tolerance')}"
    if abs(diff) <= tolerance:
        return f"final loss within noise ({_fmt_pct(diff, signed=True)} %; {noise})"
    direction = "higher (worse)" if diff > 0 else "lower (better)"
    return (f"final loss {_fmt_pct(abs(diff))} % {direction} than {base['name']}, beyond the "
            f"{noise}")


_NOISE_WORDS = {"paired": "paired step-to-step noise, 2 sigma",
                "step-to-step": "step-to-step noise, 2 sigma"}


def _fmt_pct(value: float, signed: bool = False) -> str:
    """Two significant digits (0.0038, 0.31, 4.2, 12), optionally with a sign."""
    text = f"{abs(value):.2g}" if abs(value) < 10 else f"{abs(value):.0f}"
    if "e" in text:
        text = f"{abs(value):.1e}"
    sign = ("+" if value >= 0 else "-") if signed else ("-" if value < 0 else "")
    return sign + text


def _skipped_text(row: dict[str, Any]) -> str:
    count = row["skipped_steps"]
    text = f"skipped {count} step{'s' if count != 1 else ''} to overflow (inf/NaN gradients)"
    if row["loss_scale_final"] is not None:
        text += f"; final loss scale {row['loss_scale_final']:g}"
    return text


def _status_suffix(row: dict[str, Any]) -> str:
    if row["status"] == FINISHED:
        return ""
    reason = f": {row['reason']}" if row.get("reason") else ""
    return f" (run {row['status']}{reason})"


def _basis_suffix(row: dict[str, Any]) -> str:
    if row["steady_basis"] == BASIS_NON_WARMUP:
        return " (timing from non-warm-up steps: the run recorded no steady-state steps)"
    return ""


def _why_slower(row: dict[str, Any], run: RunRecord | None) -> str:
    """Explain a slowdown only with recorded evidence (the CPU's oneDNN verdict)."""
    x = row["throughput_x"]
    if x is None or x > 1.0 - SPEED_TOLERANCE or run is None:
        return ""
    evidence = run.summary.get("cpu_evidence") or {}
    verdict, headline = evidence.get("verdict"), evidence.get("headline")
    if not headline:
        # "cpu@10.0.0.5": a sweep run a Ray cluster placed on that node's CPU
        on_cpu = run.device_key.split("@")[0] == "cpu"
        if on_cpu and run.config.precision != Precision.FP32.value:
            return (" No CPU evidence was recorded for this run (it was not profiled), so the "
                    "cause is not shown here.")
        return ""
    if verdict in SLOW_CPU_VERDICTS:  # conversion code or oneDNN's reference code decided
        return f" Why, from the CPU evidence of its profiler window: {headline}."
    return f" CPU evidence for this run: {headline}."


def _closing_notes(rows: list[dict[str, Any]], runs: Mapping[str, RunRecord]) -> list[str]:
    notes = []
    timed = [r for r in rows if r["throughput_x"] is not None]
    trusted = [r for r in timed if not r.get("busy")]  # a busy run ranks nothing
    if len(timed) >= 3 and len(trusted) < len(timed):
        notes.append("No fastest run is named: some of these runs were measured while the "
                     "machine was busy.")
    elif len(timed) >= 3:
        fastest = max(timed, key=lambda r: r["throughput_x"])
        notes.append(f"Fastest: {fastest['name']}" + (
            " (the baseline)." if fastest["is_baseline"]
            else f" ({fastest['throughput_x']:.2f}x the baseline's throughput)."))
    if any(r["device"] == "cpu" for r in rows):
        notes.append(f"The {PROCESS_PEAK_NAME} of a CPU run is the peak resident set of the "
                     "whole training process (PyTorch itself included), so precision changes "
                     f"move it less than they move the {TENSOR_PEAK_NAME}.")
    if rows and all(r["tensor_core_share"] is None for r in rows) and any(
            r["device"].startswith("cuda") for r in rows):
        notes.append("Tensor-Core use is unknown for these runs (no kernel breakdown recorded).")
    return notes


def _fmt_x(x: float) -> str:
    return f"{x:.0f}x" if x >= 10 else f"{x:.1f}x" if x >= 1.995 else f"{x:.2f}x"
