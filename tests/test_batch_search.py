"""Largest-batch search: the probe sequence, and a real memory-capped search on CPU."""

from __future__ import annotations

import pytest

from engine.config import RunConfig
from engine.run.batch_search import find_max_batch, next_probe


def test_probe_sequence_doubles_then_bisects():
    assert next_probe(None, None, 16, 4096) == 16
    assert next_probe(16, None, 16, 4096) == 32
    assert next_probe(None, 16, 16, 4096) == 8          # start did not fit: halve
    assert next_probe(256, 512, 16, 4096) == 384        # bisect
    assert next_probe(384, 400, 16, 4096) is None       # within ~6 %: done
    assert next_probe(4096, None, 16, 4096) is None     # hit the bound
    assert next_probe(None, 1, 1, 4096) is None         # nothing fits


@pytest.mark.timeout(240)
def test_capped_cpu_search_finds_a_real_limit():
    # 1200 MiB of address space: torch plus gpt-tiny fits at small batches, not at 2048.
    cfg = RunConfig(model="gpt", size="tiny", batch_size=64, memory_cap_mb=1200, device="cpu")
    seen = []
    result = find_max_batch(cfg, "cpu", max_batch=2048, max_probes=6, progress=seen.append)
    assert result["max_batch_fit"] is not None and result["max_batch_fit"] >= 64
    assert result["first_oom_batch"] is not None
    assert result["max_batch_fit"] < result["first_oom_batch"] <= 2048
    assert [p["probe"] for p in seen] == [p["batch_size"] for p in result["probes"]]
    failed = [p for p in result["probes"] if not p["fits"]]
    assert failed and all("allocate" in p["reason"] for p in failed)


@pytest.mark.timeout(240)
def test_search_for_a_multi_process_run_measures_the_batch_per_process():
    # An FSDP2 2-process config: the probes train one process, so they need no ranks.
    cfg = RunConfig(model="mlp", size="tiny", batch_size=16, nprocs=2, sharding="fsdp2",
                    precision="bf16-amp", comm_hook="bf16", device="cpu")
    result = find_max_batch(cfg, "cpu", max_batch=64, max_probes=3)
    assert result["max_batch_fit"] == 64, result
    assert all(p["fits"] for p in result["probes"])
