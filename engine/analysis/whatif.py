"""What-if from a measured step: the step time if its matrix work ran at another rate, the
rest unchanged (Amdahl). Always a projection, with what it assumes.

From a trace's (or a run's) time accounting: the matrix work is the step's matrix and
attention parts (GEMMs, convolutions and attention kernels on a GPU; the matmul and
convolution ops' self time on a CPU). It runs today at some share of its dtype's peak on
this device; the projection assumes it would run at the same share of the target's peak:

    projected = step - matrix + matrix x current_peak / target_peak

Everything else (elementwise, normalisation, copies, communication, optimizer, idle, the
CPU's other ops) is kept as measured: the part of today's step no precision change
touches. Targets: this device at its other dtypes (the GPU catalogue's datasheet rates, or
this CPU's stored measured matmul rates), and other catalogued GPUs at the same dtype
(their matrix rate only: their memory system, clocks and launch overheads are not
modelled, so that projection is a bound for the matrix part, said so).

No torch: the CLI (`engine kernels --json`), the Kernels, Live and Compare pages call it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.display import share_text
from engine.hardware.cpu_probe import conv_rates, stored_probe
from engine.hardware.gpus import DATASHEET_TFLOPS, datasheet_row

MATRIX_PARTS = ("matrix", "attention")
# A CPU rate this far below today's is an emulated dtype's microbenchmark: the model's own
# matmuls may be converted and run nearer today's rate (bench.whatif measures how far off).
EMULATED_NOTE = ("; far below today's rate (an emulated dtype): the model's own matmuls may "
                 "convert and run faster than this microbenchmark, so expect the projection "
                 "to be too slow; measure with the speedup check")
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")
ASSUMPTION = ("a projection, not a measurement: the matrix work is assumed to run at the same "
              "share of the target's peak as it does now of today's, everything else unchanged")


def rate_words(flops_per_s: float) -> str:
    return (f"{flops_per_s / 1e12:.3g} TFLOP/s" if flops_per_s >= 1e12
            else f"{flops_per_s / 1e9:.3g} GFLOP/s")


def current_dtype(result: Mapping[str, Any]) -> str | None:
    """The dtype today's matrix work ran in: the dominant matrix dtype of a GPU trace's
    kernels (fp32 without Tensor Cores, tf32, fp16, bf16, fp8), or a run's compute dtype."""
    dtype = result.get("matrix_dtype")
    return dtype if dtype in DTYPES else None


def gpu_rates(device_name: str | None) -> tuple[str | None, dict[str, float]]:
    """(catalogue row, {dtype: FLOP/s}) of a GPU by name; (None, {}) when not catalogued."""
    row = datasheet_row(device_name or "")
    if row is None:
        return None, {}
    return row, {dtype: tflops * 1e12 for dtype, tflops in DATASHEET_TFLOPS[row].items()
                 if tflops}


def conv_share(accounting: Mapping[str, Any]) -> float:
    """The share of a CPU step's matrix ops' self time spent in convolutions (the
    accounting's op table); 0 for a GPU accounting or a step without convolutions."""
    if accounting.get("kind") != "cpu":
        return 0.0
    matrix = [op for op in accounting.get("ops") or [] if op.get("part") == "matrix"]
    total_us = sum(float(op.get("self_us") or 0.0) for op in matrix)
    conv_us = sum(float(op.get("self_us") or 0.0) for op in matrix
                  if "conv" in str(op.get("cpu_op")))
    return conv_us / total_us if total_us > 0 else 0.0


def project_step(accounting: Mapping[str, Any], current_flops: float,
                 target_flops: float, conv: tuple[float, float, float] | None = None
                 ) -> dict[str, Any]:
    """The Amdahl projection of one step at another matrix rate. `conv`: (share of the
    matrix time in convolutions, today's conv rate, the target's conv rate): that share
    projected at the conv rates, the rest at the matmul rates."""
    parts = accounting.get("parts_per_step_us") or {}
    step_us = float(accounting.get("step_time_us") or 0.0)
    matrix_us = sum(float(parts.get(part) or 0.0) for part in MATRIX_PARTS)
    share, conv_current, conv_target = conv or (0.0, 1.0, 1.0)
    conv_us, matmul_us = matrix_us * share, matrix_us * (1.0 - share)
    projected_us = (step_us - matrix_us + matmul_us * current_flops / target_flops
                    + conv_us * conv_current / conv_target)
    return {"step_us": step_us, "matrix_us": matrix_us, "projected_step_us": projected_us,
            "speedup": step_us / projected_us if projected_us > 0 else None,
            "untouched_share": (step_us - matrix_us) / step_us if step_us > 0 else None}


def _untouched_parts(accounting: Mapping[str, Any]) -> str:
    parts = accounting.get("parts_per_step_us") or {}
    names = [part for part, us in parts.items() if part not in MATRIX_PARTS and (us or 0) > 0]
    return ", ".join(names) or "nothing else"


def ms_text(us: float) -> str:
    """A step time in ms to the digits that matter, never in e-notation."""
    ms = us / 1000.0
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"


def _change_words(speedup: float) -> str:
    return (f"{speedup:.3g}x faster" if speedup >= 1.005 else
            f"{1 / speedup:.3g}x slower" if speedup <= 0.995 else "no change")


def projection_words(target: Mapping[str, Any], accounting: Mapping[str, Any]) -> str:
    """"Projection: the step would take 41 ms (1.7x); 58 % of today's step (elementwise,
    optimizer, idle, copies) no precision change touches."."""
    change = _change_words(target["speedup"])
    return (f"Projection, {target['target']}: the step would take "
            f"{ms_text(target['projected_step_us'])} ms instead of "
            f"{ms_text(target['step_us'])} ms ({change}); "
            f"{target['untouched_share'] * 100:.0f} % of today's step "
            f"({_untouched_parts(accounting)}) no precision change touches.")


def _target(accounting, label, kind, current_flops, target_flops, basis,
            conv: tuple[float, float, float] | None = None) -> dict[str, Any]:
    entry = {"target": label, "kind": kind, "target_flops_per_s": target_flops,
             "basis": basis, **project_step(accounting, current_flops, target_flops, conv)}
    entry["words"] = projection_words(entry, accounting)
    return entry


def projection(result: Mapping[str, Any],
               measured_rates: Mapping[str, float] | None = None,
               op_rates: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, Any]:
    """Every projection a trace's analysis (engine.traces.explain.analyze) supports, or
    why none: {"current": {...}, "targets": [...], "assumes": ASSUMPTION} or {"none": why}.

    `measured_rates`: {dtype: FLOP/s} this device's stored matmul rates (a CPU run; a GPU
    run on this machine), used before the catalogue's. `op_rates`: {"matmul" | "conv":
    {dtype: FLOP/s}} this CPU's oneDNN probe (engine.hardware.cpu_probe): a CPU step's
    convolutions are projected at the conv rate, not the matmul rate (an fp16 conv in
    oneDNN's reference code was measured 37x slower than fp32 where fp16 matmuls were not)."""
    accounting = result.get("accounting") or {}
    if not accounting.get("step_time_us"):
        return {"none": "no step time in this trace: nothing to project"}
    dtype = current_dtype(result)
    if dtype is None:
        return {"none": "the matrix work's dtype is not known (no matrix kernels or ops)"}
    is_cpu = accounting.get("kind") != "gpu"
    probe_matmul = dict((op_rates or {}).get("matmul") or {}) if is_cpu else {}
    if not is_cpu:
        row, rates = gpu_rates(result.get("device"))
        rates = {**rates, **(measured_rates or {})}
        where = f"the {row} datasheet" if row else "this device's measured matmul rates"
    elif dtype in (measured_rates or {}):
        row, rates = None, dict(measured_rates or {})
        where = "this CPU's measured matmul rates"
    else:
        row, rates = None, probe_matmul
        where = "this CPU's oneDNN probe"
    if dtype not in rates:
        return {"none": f"today's {dtype} matrix rate on {result.get('device') or 'this device'}"
                        " is not known (not catalogued, not measured here)"}
    current = rates[dtype]
    if is_cpu and dtype in probe_matmul:
        # a dtype only the probe measured: its ratio to today's dtype in the probe, on the
        # scale of today's rate (the probe's small matmul is not a peak)
        for other, flops in probe_matmul.items():
            rates.setdefault(other, flops * current / probe_matmul[dtype])
    share = conv_share(accounting)
    conv_rate = dict((op_rates or {}).get("conv") or {})
    targets = []
    for other, flops in rates.items():
        if other == dtype or other not in DTYPES:
            continue
        basis = (f"{other} {rate_words(flops)} vs {dtype} {rate_words(current)}, from {where}"
                 + (EMULATED_NOTE if is_cpu and flops < current * 0.1 else ""))
        conv = None
        if share > 0 and dtype in conv_rate and other in conv_rate:
            conv = (share, conv_rate[dtype], conv_rate[other])
            basis += (f"; convolutions ({share_text(share)} of the matrix time) at the conv "
                      f"rate: {other} {rate_words(conv_rate[other])} vs {dtype} "
                      f"{rate_words(conv_rate[dtype])}, from this CPU's oneDNN probe")
        elif share > 0:
            basis += (f"; convolutions ({share_text(share)} of the matrix time) at the "
                      "matmul rate: no conv rate measured here (`python -m engine check` "
                      "runs the oneDNN probe)")
        targets.append(_target(accounting, f"{other} on this device", "dtype", current,
                               flops, basis, conv))
    if not is_cpu and row:
        for other_row, figures in DATASHEET_TFLOPS.items():
            if other_row != row and figures.get(dtype):
                flops = figures[dtype] * 1e12
                targets.append(_target(accounting, f"{dtype} on {other_row}", "gpu", current,
                                       flops, f"{other_row} {dtype} {rate_words(flops)} vs "
                                       f"{row} {rate_words(current)} (datasheets): another "
                                       "GPU's matrix rate only"))
    today = {"dtype": dtype, "flops_per_s": current, "device": result.get("device"),
             "basis": where}
    if is_cpu:
        today["conv_share"] = share
    return {"current": today, "targets": targets, "assumes": ASSUMPTION}


def run_op_rates(run) -> dict[str, dict[str, float]]:
    """{op: {dtype: FLOP/s}} of a CPU run: what its window stored from this machine's
    oneDNN probe, else the probe stored here now (a JSON file: no torch)."""
    if run is None or str(run.device_key).startswith("cuda") or "@" in str(run.device_key):
        return {}
    stored = (run.summary.get("cpu_evidence") or {}).get("probe_rates")
    if stored:
        return stored
    return conv_rates(stored_probe(run.device_key, run.device_name or ""))


def run_projection(result: dict, run, read_cache: bool = True) -> dict:
    """The what-if projection of a trace's step; for a run, its compute dtype and the
    matmul rates its trainer stored (summary "matmul_rates"), else, with `read_cache`, this
    device's stored measurements (imports torch: the pages pass False)."""
    if run is None:
        return projection(result)
    result["matrix_dtype"] = result.get("matrix_dtype") or run.summary.get("compute_dtype")
    rates = run.summary.get("matmul_rates")
    if rates is None and read_cache:
        rates = measured_rates(run.device_key)
    return projection(result, rates, run_op_rates(run))


def summary_projection(run) -> dict:
    """The projection of a run's profiler window from its stored summary (Live, Compare:
    no trace read, no torch), with the matmul rates its trainer stored."""
    explain = run.summary.get("explain") or {}
    if not explain.get("accounting"):
        return {"none": "this run has no analysed profiler window (it ran with --no-profile, "
                        "or ended before its window)"}
    result = {"accounting": explain["accounting"], "device": run.device_name,
              "matrix_dtype": explain.get("matrix_dtype")}
    return run_projection(result, run, read_cache=False)


def projection_rows(proj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One table row per target, as the Kernels, Live and Compare pages show them."""
    return [{"what if": t["target"], "projected step (ms)": ms_text(t["projected_step_us"]),
             "today (ms)": ms_text(t["step_us"]),
             "change": _change_words(t["speedup"]),
             "untouched by precision": f"{t['untouched_share'] * 100:.0f} %",
             "basis": t["basis"]} for t in proj.get("targets", [])]


def measured_rates(device_key: str) -> dict[str, float]:
    """{dtype: FLOP/s} of this machine's stored quiet matmul measurements for a device."""
    from engine.hardware.devices import get_device  # late: device discovery, a run's only
    from engine.hardware.peaks import COMPUTE_DTYPES, reference_peaks  # late: as above

    if "@" in device_key:  # a Ray run's device on another node: nothing measured here
        return {}
    try:
        device = get_device(device_key)
        rates = {dtype: reference_peaks(device, dtype)["measured"]["flops_per_s"]
                 for dtype in COMPUTE_DTYPES}
    except Exception:  # noqa: BLE001 - a device not here any more: the catalogue only
        return {}
    return {dtype: flops for dtype, flops in rates.items() if flops}
