"""engine.display: the one formatter per kind of figure every surface prints through."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from engine.display import (
    GIB,
    LOSS_PRINTF,
    MIB,
    NA,
    THROUGHPUT_PRINTF,
    interval_text,
    loss_text,
    measured,
    memory_printf,
    memory_text,
    memory_unit,
    memory_value,
    mfu_text,
    ratio_text,
    share_text,
    step_time_text,
    throughput_text,
)

NOT_MEASURED = [None, float("nan"), math.inf, np.nan, pd.NA, "12", True]


@pytest.mark.parametrize("value", NOT_MEASURED, ids=repr)
def test_a_figure_not_measured_reads_n_a_never_none_or_nan(value):
    assert not measured(value)
    for text in (memory_text(value), loss_text(value), throughput_text(value),
                 step_time_text(value), ratio_text(value), mfu_text(value), share_text(value)):
        assert text == NA
    assert interval_text(value, 1.2) == ""  # a blank beside a ratio that says why


def test_numpy_and_pandas_numbers_are_numbers():
    assert measured(np.float32(1.5)) and measured(np.int64(3))
    assert loss_text(np.float64(1.19951)) == "1.1995"
    assert memory_text(np.int64(512 * MIB)) == "512.0 MiB"


def test_memory_in_mib_below_a_gib_and_gib_from_there():
    assert memory_text(700 * MIB) == "700.0 MiB"
    assert memory_text(GIB - MIB) == "1,023.0 MiB"
    assert memory_text(GIB) == "1.00 GiB"
    assert memory_text(1.2 * GIB) == "1.20 GiB"
    assert memory_text(0) == NA  # a peak of 0 bytes is no reading
    # a column takes one unit, the largest value's
    assert memory_unit([700 * MIB, 1.2 * GIB, None]) == "GiB"
    assert memory_unit([700 * MIB, float("nan")]) == "MiB" == memory_unit([])
    assert memory_text(700 * MIB, "GiB") == "0.68 GiB"
    assert memory_value(700 * MIB, "GiB") == 0.68
    # the grid's printf twin prints what memory_text prints
    assert memory_printf("GiB") % memory_value(1.2 * GIB, "GiB") == "1.20"


def test_loss_keeps_four_decimals_and_a_tiny_one_its_digits():
    assert loss_text(1.1995) == "1.1995" and LOSS_PRINTF % 1.1995 == "1.1995"
    assert loss_text(1.2) == "1.2000"  # not "1.2": the digits do not come and go
    assert loss_text(0.0) == "0.0000"
    assert loss_text(2.345e-05) == "2.35e-05"


def test_throughput_step_time_ratio_interval_mfu_share():
    assert throughput_text(18444.46) == "18,444.5"
    assert throughput_text(18444.46, "samples/s") == "18,444.5 samples/s"
    assert (THROUGHPUT_PRINTF % 18444.46) == "18444.5"  # grids add no thousands separator
    assert step_time_text(1.037) == "1.04 ms" and step_time_text(1.037, with_unit=False) == "1.04"
    assert ratio_text(1.2449) == "1.24x" and ratio_text(0.0027) == "0.0027x"
    assert ratio_text(0) == NA
    assert interval_text(0.775, 0.851) == "0.78-0.85x"
    assert mfu_text(0.42) == "42.0 %" and mfu_text(0.0034) == "0.34 %"
    assert share_text(0.99978, 1) == "99.98 %" and share_text(1.0, 1) == "100.0 %"
    assert share_text(0.9999999) == "> 99.9999 %" and share_text(0.0) == "0 %"


def test_display_imports_nothing_from_the_engine():
    """Every wing formats through it, the lowest included: it must stay a leaf."""
    import ast
    from pathlib import Path

    import engine.display

    tree = ast.parse(Path(engine.display.__file__).read_text())
    imported = [node.module if isinstance(node, ast.ImportFrom) else alias.name
                for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names]
    assert not [name for name in imported if name and name.startswith("engine")], imported
