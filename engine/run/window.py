"""After a run's profiler window: turn the trace (GPU) or the oneDNN log (CPU) into the
kernel table and the Tensor-Core verdict stored with the run.

Runs in the trainer process right after the window closes; its time is excluded from
the step timings (the training loop restarts its interval clock afterwards).
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any, Callable, Iterable

from engine.analysis.cpu_evidence import cpu_verdict, parse_onednn_verbose
from engine.hardware.cpu_probe import conv_rates, stored_probe
from engine.hardware.devices import get_device, read_cpu_flags
from engine.store import Store

NO_KERNELS_ERROR = ("the profiler recorded no GPU kernel events on a CUDA run: CUPTI "
                    "probably failed silently (driver/CUPTI mismatch, or profiling not "
                    "permitted for this user); the Tensor-Core verdict is unavailable")


def window_handler(store: Store, run_id: str, device_key: str) -> Callable[[Any, str], None]:
    """The `on_window` callback train() takes: analyse the window that just closed. The
    analysis must never cost the run: a failure is recorded in the summary, not raised."""
    def on_window(window, compute_dtype: str) -> None:
        try:
            analyze_window(store, run_id, device_key, window.trace_path,
                           window.onednn_log_path, compute_dtype, gpm=window.gpm,
                           write_errors=getattr(window, "write_errors", ()))
        except Exception as exc:  # noqa: BLE001 - reported in the summary and the log
            traceback.print_exc()
            store.merge_summary(run_id, {"profile_error": f"{type(exc).__name__}: {exc}"})

    return on_window


def analyze_window(store: Store, run_id: str, device_key: str, trace_path: Path | None,
                   onednn_log_path: Path | None, compute_dtype: str,
                   gpm: tuple[float | None, str] | None = None,
                   write_errors: Iterable[str] = ()) -> dict[str, Any]:
    """Store the kernel table and return the summary fields it produced. `write_errors`:
    why the window's trace or oneDNN log was dropped (a full disk), one line each; they
    become the summary's profile_error, which Live and Kernels show."""
    summary: dict[str, Any] = {"compute_dtype": compute_dtype}
    if gpm is not None:
        summary["gpm_tensor_util_pct"], summary["gpm_note"] = gpm
    if trace_path is not None:
        summary["trace_file"] = trace_path.name
    if device_key.startswith("cuda") and trace_path is not None:
        summary.update(_gpu_kernels(store, run_id, trace_path))
    if onednn_log_path is not None:
        summary["cpu_evidence"] = _cpu_evidence(onednn_log_path, compute_dtype, device_key)
    if trace_path is not None and trace_path.exists() and "profile_error" not in summary:
        summary["explain"] = _explain(trace_path, summary.get("cpu_evidence"))
    if write_errors:
        summary["profile_error"] = "; ".join(
            [*write_errors, *([summary["profile_error"]] if "profile_error" in summary else [])])
    store.merge_summary(run_id, summary)
    return summary


def _explain(trace_path: Path, cpu_evidence: dict | None) -> dict[str, Any]:
    """Where the window's step time went and what bounds it (the Live banner), kept small:
    the full tables are recomputed from the trace by the Kernels page."""
    # pandas and the trace parser: loaded only once a window has closed
    from engine.traces.explain import analyze

    try:
        result = analyze(trace_path, cpu_evidence=cpu_evidence)
    except Exception as exc:  # noqa: BLE001 - the verdict is optional; the run is not
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    if "accounting" not in result:  # a range-profiler or other-accelerator trace
        return {"banner": result["banner"], "kind": result.get("trace_kind")}
    accounting = result["accounting"]
    return {"banner": result["banner"], "bound_by": result["bound_by"],
            "kind": accounting.get("kind"), "step_time_us": accounting.get("step_time_us"),
            "busy_us": result.get("busy_us"), "idle_us": result.get("idle_us"),
            "idle_share": result.get("idle_share"), "copy_us": result.get("copy_us"),
            "overlap_us": result.get("overlap_us"),
            "parts_per_step_us": accounting.get("parts_per_step_us"),
            "matrix_dtype": result.get("matrix_dtype"),  # the what-if's today (GPU kernels)
            # what bound_by reads, so run.finalize can decide again with the run's measured
            # data wait (the window alone sees a few steps' DataLoader spans at most)
            "accounting": {key: accounting.get(key) for key in BOUND_BY_KEYS}}


BOUND_BY_KEYS = ("kind", "step_time_us", "window", "parts_per_step_us", "data_loader_us",
                 "exposed_communication_us", "idle_share", "median_kernel_us",
                 "kernel_count", "sync_calls", "conv_kernel_us", "ops")


def _gpu_kernels(store: Store, run_id: str, trace_path: Path) -> dict[str, Any]:
    # late: only a GPU trace needs the trace analysis, so a CPU trainer never loads it
    from engine.traces.parser import load_trace
    from engine.traces.verdict import breakdown, kernel_summary_rows  # late: as above

    parsed = load_trace(trace_path)
    table = parsed.table
    if parsed.kind in ("range profiler", "other accelerator"):
        # no kernel timeline, but not CUPTI's silence: the Kernels page reads its evidence
        return {"trace_kind": parsed.kind}
    if table.empty:
        return {"profile_error": NO_KERNELS_ERROR}
    result = breakdown(table)  # the device named in the trace (table.attrs)
    store.write_kernels(run_id, kernel_summary_rows(table))
    keep = ("total_kernel_us", "tensor_core_us", "tensor_core_share", "matrix_us",
            "matrix_tensor_core_share", "categories", "verdict", "could_have_didnt")
    return {"kernels": {key: result.get(key) for key in keep}}


def _cpu_evidence(log_path: Path, compute_dtype: str, device_key: str = "cpu"
                  ) -> dict[str, Any]:
    try:
        text = log_path.read_text(errors="replace")
    except OSError as exc:
        return {"verdict": "unknown", "headline": f"oneDNN log unreadable: {exc.strerror}",
                "evidence": []}
    evidence = cpu_verdict(parse_onednn_verbose(text), compute_dtype, read_cpu_flags())
    # The per-op rates this machine's oneDNN probe stored (none measured here: the probe
    # is doctor's and the device check's), kept with the run for its what-if.
    try:
        device = get_device(device_key)
    except KeyError:
        return evidence
    rates = conv_rates(stored_probe(device.key, device.name))
    if any(rates.values()):
        evidence["probe_rates"] = rates
    return evidence
