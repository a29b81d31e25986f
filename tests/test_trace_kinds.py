"""Traces that are not kernel timelines say what they are (engine.traces.kinds): a CUPTI
range-profiler trace (per-kernel SASS counters, no `kernel` events) and a trace of another
accelerator (Meta MTIA). Neither is ever called a CPU run. Both are real public traces
(tests/data/traces/SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.cli.main import main
from engine.traces.explain import analyze
from engine.traces.parser import _parse_plain, _parse_trace, load_trace

OTHER = Path(__file__).parent / "data" / "traces" / "other_kinds"
RANGE = OTHER / "a100_cupti_range_profiler_hta.json.gz"
MTIA = OTHER / "mtia_single_rank_hta.json.gz"


@pytest.mark.parametrize("path", [RANGE, MTIA], ids=lambda p: p.name)
def test_both_readers_keep_the_same_ranges_and_device_events(path):
    fast, plain = _parse_trace(path), _parse_plain(path, str(path))
    assert fast[0] == plain[0]
    assert fast[0].ranges or fast[0].other_devices


def test_a_range_profiler_trace_is_read_as_one_and_its_counters_are_the_evidence():
    parsed = load_trace(RANGE)
    assert parsed.kind == "range profiler" and len(parsed.ranges) == 77
    result = analyze(parsed)
    assert result["trace_kind"] == "range profiler"
    assert "accounting" not in result and "CPU" not in result["banner"]["headline"]
    evidence = result["range_profiler"]
    by_name = {k["name"]: k for k in evidence["kernels"]}
    sgemm = by_name["ampere_sgemm_32x32_sliced1x4_tn"]
    assert sgemm["counter_verdict"] == "no" and sgemm["ffma"] > 1e8  # MACs on CUDA cores
    xmma = [k for k in evidence["kernels"] if k["name"].startswith("void xmma_new::gemm")]
    assert xmma and all(k["counter_verdict"] == "yes" and k["ffma"] == 0 for k in xmma)
    assert evidence["counters_agree_with_names"] is True
    assert evidence["tensor_cores"] == "partly"
    assert result["device"] == "NVIDIA A100-PG509-200"


def test_an_mtia_trace_is_named_and_not_called_a_cpu_run():
    parsed = load_trace(MTIA)
    assert parsed.kind == "other accelerator"
    result = analyze(parsed)
    assert result["device"] == "Meta MTIA"
    assert result["verdict"]["tensor_cores"] == "unknown"
    assert "not a CPU run" in result["banner"]["headline"]


@pytest.mark.parametrize("path, words", [(RANGE, "Kind:   range profiler"),
                                         (MTIA, "Kind:   other accelerator")],
                         ids=["range", "mtia"])
def test_the_cli_names_the_kind_in_text_and_json(path, words, capsys):
    assert main(["kernels", str(path)]) == 0
    text = capsys.readouterr().out
    assert words in text and "CPU run:" not in text and "Device: CPU" not in text
    assert main(["kernels", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trace_kind"] in (
        "range profiler", "other accelerator")
