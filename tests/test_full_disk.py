"""A full disk under the data directory: a clear error, no crash loop, runs kept.

Uses a real 2 MiB tmpfs mount (needs root, as CI and the dev machines run); skipped with
the reason elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.config import RunConfig
from engine.store import Store, StoreError

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _fill(directory: Path) -> Path:
    filler = directory / "filler"
    try:
        with open(filler, "wb") as handle:
            while True:
                handle.write(b"\0" * 4096)
                handle.flush()
    except OSError:  # ENOSPC, on a write or on the final flush at close: full, as wanted
        pass
    return filler


@pytest.mark.slow
def test_full_disk_is_a_clear_error_and_runs_survive(small_disk, monkeypatch):
    home = small_disk / "lab"
    store = Store(home)
    old = store.create_run(RunConfig(model="mlp"), "cpu", "test cpu")
    store.write_metrics(old, [{"step": 1, "loss": 2.0, "phase": "warmup"}])
    filler = _fill(small_disk)

    with pytest.raises(StoreError) as info:
        for step in range(2, 20_000):  # the WAL grows until the disk says no
            store.write_metrics(old, [{"step": step, "loss": 1.0, "phase": "steady"}])
    message = str(info.value)
    assert "full" in message and "PRECISION_LAB_HOME" in message

    # Every page says so plainly instead of raising, launch included.
    monkeypatch.setenv("PRECISION_LAB_HOME", str(home))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    for page in ("pages/live.py", "pages/runs.py"):
        at.switch_page(page).run()
        assert not at.exception, (page, at.exception)
        assert any("full" in err.value for err in at.error), page

    # Space back: the store opens again and the run written before is intact.
    filler.unlink()
    again = Store(home)
    assert again.get_run(old).config.model == "mlp"
    assert again.read_metrics(old, max_points=None)["step"].iloc[0] == 1
