"""The finished-run overview: same spikes as a full downsampled read, used by chart reads."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import RunConfig
from engine.store import Store
from engine.store.series import OVERVIEW_POINTS


@pytest.fixture
def long_run(tmp_path):
    store = Store(tmp_path / "lab")
    run_id = store.create_run(RunConfig(), "cpu")
    steps = 50_000
    loss = np.linspace(5.0, 1.0, steps)
    loss[31_337] = 40.0  # one spike that must survive
    rows = [{"step": i + 1, "loss": float(loss[i]), "samples_per_s": 1000.0 + (i % 7),
             "phase": "steady"} for i in range(steps)]
    for start in range(0, steps, 10_000):
        store.write_metrics(run_id, rows[start:start + 10_000])
    return store, run_id


def test_overview_keeps_spikes_and_serves_first_reads(long_run):
    store, run_id = long_run
    written = store.write_overview(run_id)
    assert 0 < written <= OVERVIEW_POINTS + 2
    first = store.read_metrics(run_id, max_points=OVERVIEW_POINTS)
    assert len(first) == written  # served from the overview
    assert first["loss"].max() == 40.0 and 31_338 in set(first["step"])
    assert first["step"].iloc[0] == 1 and first["step"].iloc[-1] == 50_000
    # Incremental reads and full reads still come from the full table.
    assert len(store.read_metrics(run_id, after_step=49_990, max_points=None)) == 10
    assert len(store.read_metrics(run_id, max_points=None)) == 50_000


def test_without_an_overview_reads_fall_back_to_the_full_table(long_run):
    store, run_id = long_run
    frame = store.read_metrics(run_id, max_points=OVERVIEW_POINTS, columns=["loss"])
    assert len(frame) <= OVERVIEW_POINTS + 2 and frame["loss"].max() == 40.0
