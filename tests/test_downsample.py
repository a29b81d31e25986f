"""downsample_minmax: at most ~N rows, first/last kept, every bucket's min and max kept."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.store.downsample import downsample_minmax


def frame_of(**columns) -> pd.DataFrame:
    n = len(next(iter(columns.values())))
    return pd.DataFrame({"step": np.arange(1, n + 1), **columns})


def buckets_of(n_rows: int, n_columns: int, max_points: int) -> np.ndarray:
    """The bucket each row falls in, computed independently of the implementation."""
    buckets = max(1, max_points // (2 * n_columns))
    return np.array([i * buckets // n_rows for i in range(n_rows)])


def test_small_frames_are_returned_untouched():
    frame = frame_of(loss=[3.0, 1.0, 2.0, np.nan, 5.0])
    out = downsample_minmax(frame, ["loss"], max_points=5)
    assert out is frame
    frame = frame_of(loss=np.arange(100.0))
    assert downsample_minmax(frame, ["loss"], max_points=2000) is frame


def test_no_value_columns_means_no_downsampling():
    frame = frame_of(loss=np.arange(10_000.0))
    assert downsample_minmax(frame, [], max_points=100) is frame
    assert downsample_minmax(frame, ["not_a_column"], max_points=100) is frame


def test_too_few_points_is_refused():
    with pytest.raises(ValueError, match="max_points=3"):
        downsample_minmax(frame_of(loss=np.arange(10.0)), ["loss"], max_points=3)


def test_first_and_last_rows_are_kept_even_when_not_extremes():
    values = np.full(10_000, 5.0)
    values[1::2] = 1.0   # minima and maxima are everywhere but the ends are mid-range
    values[2::4] = 9.0
    values[0] = values[-1] = 5.0
    out = downsample_minmax(frame_of(loss=values), ["loss"], max_points=100)
    assert out["step"].iloc[0] == 1 and out["step"].iloc[-1] == 10_000


def test_keeps_the_min_and_max_of_every_bucket_and_nothing_else():
    rng = np.random.default_rng(0)
    n, max_points = 50_000, 400
    loss, rate = rng.normal(size=n), rng.normal(size=n)
    frame = frame_of(loss=loss, rate=rate)
    out = downsample_minmax(frame, ["loss", "rate"], max_points)
    bucket = buckets_of(n, 2, max_points)
    expected = {0, n - 1}
    for values in (loss, rate):
        for b in np.unique(bucket):
            rows = np.flatnonzero(bucket == b)
            expected.add(int(rows[np.argmin(values[rows])]))
            expected.add(int(rows[np.argmax(values[rows])]))
    assert set(out.index) == expected
    assert len(out) <= max_points + 2
    assert out.index.is_monotonic_increasing  # order preserved
    # the extremes of the whole series are among them
    assert out["loss"].max() == loss.max() and out["loss"].min() == loss.min()


def test_a_single_spike_and_a_single_dip_survive():
    values = np.ones(100_000)
    values[12_345] = 1e6
    values[87_654] = -1e6
    out = downsample_minmax(frame_of(loss=values), ["loss"], max_points=2000)
    assert 12_346 in set(out["step"]) and 87_655 in set(out["step"])
    assert len(out) <= 2002


def test_nan_rows_never_win_and_an_all_nan_column_keeps_only_the_ends():
    n = 10_000
    loss = np.linspace(0.0, 1.0, n)
    loss[::3] = np.nan
    frame = frame_of(loss=loss, loss_scale=np.full(n, np.nan))
    out = downsample_minmax(frame, ["loss", "loss_scale"], max_points=200)
    kept = out["loss"].to_numpy()
    inner = kept[1:-1]  # first/last are kept whatever they hold
    assert not np.isnan(inner).any()
    only_nan = downsample_minmax(frame_of(loss_scale=np.full(n, np.nan)), ["loss_scale"], 200)
    assert list(only_nan.index) == [0, n - 1]


def test_infinite_values_are_kept_as_extremes():
    values = np.zeros(10_000)
    values[5_000] = np.inf
    values[7_000] = -np.inf
    out = downsample_minmax(frame_of(loss=values), ["loss"], max_points=100)
    assert np.isposinf(out["loss"]).sum() == 1 and np.isneginf(out["loss"]).sum() == 1


def test_none_and_numeric_strings_are_coerced():
    values = [None] * 5_000 + [1.0] * 4_999 + [50.0]
    frame = pd.DataFrame({"step": range(10_000), "loss_scale": pd.Series(values, dtype=object)})
    out = downsample_minmax(frame, ["loss_scale"], max_points=100)
    assert 50.0 in set(out["loss_scale"])
    assert len(out) <= 102


def test_non_value_columns_ride_along():
    n = 5_000
    frame = frame_of(loss=np.arange(n, dtype=float), phase=["steady"] * n)
    out = downsample_minmax(frame, ["loss"], max_points=100)
    assert set(out.columns) == {"step", "loss", "phase"}
    assert (out["phase"] == "steady").all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=1, max_size=600),
       st.integers(4, 64))
def test_property_size_bound_and_extremes_kept(values, max_points):
    frame = frame_of(loss=np.array(values, dtype=float))
    out = downsample_minmax(frame, ["loss"], max_points)
    if len(values) <= max_points:
        assert out is frame
        return
    assert len(out) <= max_points + 2
    assert out.index.is_monotonic_increasing and out.index.is_unique
    finite = frame["loss"].dropna()
    if len(finite):
        assert out["loss"].max() == finite.max()
        assert out["loss"].min() == finite.min()
