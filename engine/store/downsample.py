"""Min/max bucket downsampling: at most ~N points per series, spikes kept.

A loss spike or a throttling dip is exactly what a person looks for in a long run, so
plain striding (which drops it) is not acceptable. Each bucket keeps the rows holding
the minimum and the maximum of every requested column, plus the first and last row.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def downsample_minmax(frame: pd.DataFrame, value_columns: list[str],
                      max_points: int = 2000) -> pd.DataFrame:
    """Return at most about `max_points` rows of `frame` (sorted by its current order)."""
    if max_points < 4:
        raise ValueError(f"max_points={max_points}: need at least 4 points")
    columns = [c for c in value_columns if c in frame.columns]
    if len(frame) <= max_points or not columns:
        return frame
    buckets = max(1, max_points // (2 * len(columns)))
    positions = np.arange(len(frame))
    bucket_of_row = positions * buckets // len(frame)
    keep = np.zeros(len(frame), dtype=bool)
    keep[[0, -1]] = True
    for column in columns:
        values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
        keep |= _bucket_extremes(values, bucket_of_row, buckets)
    return frame.iloc[np.flatnonzero(keep)]


def _bucket_extremes(values: np.ndarray, bucket_of_row: np.ndarray, buckets: int) -> np.ndarray:
    """Mask of the rows that hold each bucket's min and max (NaN rows never win)."""
    keep = np.zeros(len(values), dtype=bool)
    finite = ~np.isnan(values)
    if not finite.any():
        return keep
    rows = np.flatnonzero(finite)
    vals, groups = values[rows], bucket_of_row[rows]
    # Sort by (bucket, value): the first row of each bucket is its min, the last its max.
    order = np.lexsort((vals, groups))
    sorted_groups = groups[order]
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    ends = np.r_[starts[1:], len(order)] - 1
    keep[rows[order[starts]]] = True
    keep[rows[order[ends]]] = True
    # Non-finite values (inf) are spikes too; numpy sorts +inf last so max already has it.
    return keep
