"""What a run leaves behind when it ends, besides its status: the downsampled metrics
overview and the statistics the Compare page needs.

Every executor (the local trainer, a rank-0 process of a multi-process run, a Ray task
writing through the store actor) calls `finalize_run_data` once the last metric rows are
flushed and before the final status is set, so a finished run never needs a full read
of its metric table again.
"""

from __future__ import annotations

import traceback
from typing import Any

from .store import Store


def result_summary(result, peak_flops: float | None) -> dict[str, Any]:
    """A TrainResult as every executor stores it in the run summary, with MFU against
    `peak_flops` (FLOP/s of the run's devices), or the reason MFU is left out."""
    from .train import plausible_mfu

    summary = result.to_dict()
    if peak_flops and result.achieved_tflops:
        summary["mfu"] = plausible_mfu(result.achieved_tflops * 1e12, peak_flops)
        if summary["mfu"] is None:
            summary["mfu_note"] = (
                f"MFU omitted: the run achieved {result.achieved_tflops * 1e3:.3g} GFLOP/s, "
                f"more than the {peak_flops / 1e9:.3g} GFLOP/s peak measured by the matmul "
                "microbenchmark, so that peak does not represent this model's matmuls "
                "(typical of emulated dtypes)")
    return summary


def finalize_run_data(store: Store, run_id: str) -> None:
    """Write the run's metrics overview (and comparison stats). Never raises: these are
    optimisations, readers fall back to the full metric table."""
    try:
        store.write_overview(run_id)
    except Exception:  # noqa: BLE001 - an optimisation, never a reason to fail a run
        traceback.print_exc()
    try:
        from .compare import COMPARE_STATS_KEY, METRICS_FOR_COMPARE, frame_stats

        frame = store.read_metrics(run_id, max_points=None, columns=METRICS_FOR_COMPARE)
        store.merge_summary(run_id, {COMPARE_STATS_KEY: frame_stats(frame)})
    except Exception:  # noqa: BLE001 - the Compare page recomputes them from the rows
        traceback.print_exc()
