"""Smoke test of bench/traces.py (tests/test_bench.py style): it runs with --quick on one
fixture as a subprocess and its last stdout line is one JSON object with the figures."""

from __future__ import annotations

import importlib.util

import pytest
from test_bench import assert_common, assert_finite, run_bench

pytestmark = pytest.mark.slow


def test_traces_reports_time_and_memory_and_says_whether_hta_compared():
    result = run_bench("bench.traces")
    assert_common(result, "traces")
    [row] = result["rows"]
    assert row["trace"] == "h100_bert_small_tracelens.json.gz"
    assert_finite(row["analysis_s"], "analysis_s")
    assert row["peak_mib"] > 0
    assert row["idle_share"] == pytest.approx(0.9301, abs=1e-4)
    if importlib.util.find_spec("hta") is None:
        assert row["hta"] == "not installed" and result["hta_compared"] == 0
    else:
        assert row["hta"] == "ok" or row["hta"].startswith("failed: ")
