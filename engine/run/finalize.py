"""What a run leaves behind when it ends, besides its status: the downsampled metrics
overview and the statistics the Compare page needs.

Every executor (the local trainer, a rank-0 process of a multi-process run, a Ray task
writing through the store actor) calls `finalize_run_data` once the last metric rows are
flushed and before the final status is set, so a finished run never needs a full read
of its metric table again.
"""

from __future__ import annotations

import traceback

from engine.schema import mfus_against, plausible_mfu
from engine.store import Store


def finalize_run_data(store: Store, run_id: str) -> None:
    """Write the run's metrics overview (and comparison stats). Never raises: these are
    optimisations, readers fall back to the full metric table."""
    try:
        store.write_overview(run_id)
    except Exception:  # noqa: BLE001 - an optimisation, never a reason to fail a run
        traceback.print_exc()
    try:
        # pandas and the statistics: kept out of the supervisor, which imports this module
        from engine.analysis.steady import COMPARE_STATS_KEY, METRICS_FOR_COMPARE, frame_stats

        frame = store.read_metrics(run_id, max_points=None, columns=METRICS_FOR_COMPARE)
        stats = frame_stats(frame)
        summary = store.get_run(run_id).summary
        store.merge_summary(run_id, {COMPARE_STATS_KEY: stats,
                                     **one_throughput_figure(stats, summary),
                                     **bound_by_with_data_wait(summary)})
    except Exception:  # noqa: BLE001 - the Compare page recomputes them from the rows
        traceback.print_exc()


def one_throughput_figure(stats: dict, summary: dict | None = None) -> dict:
    """The run's throughput, step time, achieved TFLOP/s and MFU as every surface shows
    them: medians over its steady-state steps (the Compare page's figures). The training
    loop's time-weighted mean is kept beside them as samples_per_s_mean; on a busy machine
    the two differ (the mean follows the slow steps), and Live, Compare and the report must
    not show two MFUs for one run. An MFU the run left out as implausible (summary mfu None
    with its mfu_note) stays out."""
    steady = stats.get("steady") or {}
    if steady.get("basis") != "steady":
        return {}
    figures = {"throughput_basis": "median over steady-state steps"}
    for key in ("samples_per_s", "tokens_per_s", "step_time_ms", "achieved_tflops"):
        if steady.get(key) is not None:
            figures[key] = steady[key]
    summary = summary or {}
    if steady.get("mfu") is not None and summary.get("mfu") is not None:
        figures["mfu"] = steady["mfu"]
    elif summary.get("mfu") is not None and steady.get("achieved_tflops"):
        # The peak was measured after the steps (none stored at the start), so the rows
        # carry no MFU: the same steady median, against that peak.
        figures["mfu"] = plausible_mfu(steady["achieved_tflops"] * 1e12,
                                       summary.get("peak_flops"))
    peaks = summary.get("mfu_peaks")
    if isinstance(peaks, dict) and "error" not in peaks and steady.get("achieved_tflops"):
        figures["mfu_peaks"] = mfus_against(peaks, steady["achieved_tflops"])
    return figures


def bound_by_with_data_wait(summary: dict) -> dict:
    """The profiler window's bound-by verdict decided again with the run's measured wait
    for its next batch (steady steps), where the run measured one: an input pipeline that
    holds the loop back is then input-bound whatever the trace's few steps showed."""
    # the trace analysis imports pandas: kept out of the supervisor with the rest here
    from engine.traces.bound import bound_by

    explain, wait_ms = summary.get("explain") or {}, summary.get("data_wait_ms")
    if not explain.get("accounting") or wait_ms is None:
        return {}
    verdict = bound_by(explain["accounting"], data_wait_ms=wait_ms)
    banner = dict(explain.get("banner") or {})
    banner["sentence"], banner["advice"] = verdict["sentence"], verdict["advice"]
    return {"explain": {**explain, "bound_by": verdict, "banner": banner}}
