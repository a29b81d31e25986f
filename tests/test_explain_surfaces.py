"""The bound-by verdict and the B-vs-A explanation on Live, Compare and in the HTML report,
for two real profiled CPU runs of this machine (fp32 vs bf16-amp, real workers)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from _real_runs import tiny_config
from streamlit.testing.v1 import AppTest

from engine.report.html import build_html
from engine.run.launcher import launch
from engine.schema import FINAL_STATUSES
from engine.traces.explain import explain_diff, explain_runs, run_caveats, window_note

APP = str(Path(__file__).resolve().parent.parent / "app.py")
pytestmark = pytest.mark.slow


@pytest.fixture
def two_profiled_runs(store):
    ids = [launch(tiny_config(p, steps=14, profile=True, profile_steps=3), store)
           for p in ("fp32", "bf16-amp")]
    deadline = time.monotonic() + 240
    while not all(store.get_run(i).status in FINAL_STATUSES for i in ids):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert [store.get_run(i).status for i in ids] == ["finished"] * 2
    return ids


def _text(at: AppTest) -> str:
    parts = [
        e.value for kind in ("markdown", "caption", "info", "warning") for e in getattr(at, kind)
    ]
    return re.sub(r"\\(.)", r"\1", "\n".join(parts))


@pytest.mark.timeout(400)
def test_bound_by_and_why_b_is_faster_on_live_compare_and_report(store, two_profiled_runs):
    base_id, other_id = two_profiled_runs
    other = store.get_run(other_id)
    explain = other.summary["explain"]
    assert explain["kind"] == "cpu" and explain["bound_by"]["verdict"] in (
        "input", "cpu_launch", "memory", "math", "communication", "unknown")

    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["run"] = other_id
    at.run()
    at.switch_page("pages/live.py").run()
    assert not at.exception, at.exception
    assert any(i.value.startswith("**Bound by:**") and
               re.sub(r"\\(.)", r"\1", i.value).find(explain["bound_by"]["sentence"]) > 0
               for i in at.info), [i.value for i in at.info]
    # ... with what it covers: the profiled steps (and whether they represent the run)
    assert any(box.value.startswith("From the ") for box in [*at.caption, *at.warning])

    diff = explain_runs(store, store.get_run(base_id), other)
    assert diff and not diff.get("error")
    total_a = sum(part["a_us"] for part in diff["parts"])
    assert total_a == pytest.approx(diff["step_time_a_us"], rel=0.02)  # the parts add up

    at.query_params["runs"] = f"{base_id},{other_id}"
    at.query_params["baseline"] = base_id
    at.switch_page("pages/compare.py").run()
    assert not at.exception, at.exception
    assert "Why one run is faster than another" in [h.value for h in at.subheader]
    assert diff["sentence"] in _text(at)
    assert explain["bound_by"]["sentence"] in _text(at)  # each run's bound-by verdict

    report = build_html(store, [base_id, other_id], base_id)
    assert "Why one run is faster than another (profiler windows)" in report
    assert "What limits each run's step:" in report
    assert diff["sentence"].replace("'", "&#x27;") in report.replace("&gt;", ">")
    # the comparison says what it covers, on Compare and in the report alike
    [note] = [c["text"] for c in diff["caveats"] if c["severity"] == "note"]
    assert note.startswith("From the profiled steps only (3 of ") and note in _text(at)
    assert note.replace("'", "&#x27;") in report


TRACES = Path(__file__).resolve().parent / "data" / "traces"


def test_two_gpus_and_an_unrepresentative_or_busy_window_are_said():
    """The caveats every B-vs-A surface shows: A100 against H100 is two GPUs; a window 6x
    faster while the steady steps are 0.79x is not the run; a busy run is unreliable."""
    diff = explain_diff(TRACES / "a100_conv_nccl_hta.json.gz",
                        TRACES / "h100_bert_small_tracelens.json.gz")
    # a conv+NCCL job against BERT is not the same work either: said first
    different_work, two_gpus = diff["caveats"]
    assert different_work["text"].startswith("A and B ran different work")
    assert two_gpus["severity"] == "warning"
    assert two_gpus["text"].startswith(f"A ran on {diff['device_a']}, B on {diff['device_b']}")
    diff.update(label_a="fp32", label_b="bf16-amp", step_speedup=6.0, steps_a=3, steps_b=3)
    busy = {"busy": True, "words": "measured while the machine was busy (load 3.1 on 2 cores)"}
    caveats = run_caveats(diff, {"step_time_ms": 100.0},
                          {"step_time_ms": 126.6, "contention": busy})
    assert [c["severity"] for c in caveats] == ["note", "warning", "warning"]
    assert caveats[1]["text"].startswith("The steady steps say 0.79x (100.00 -> 126.60 ms a step), "
                                         "not the window's 6.00x")
    assert caveats[2]["text"] == f"bf16-amp: {busy['words']}"
    agreeing = run_caveats(diff, {"step_time_ms": 60.0}, {"step_time_ms": 10.5})
    assert [c["severity"] for c in agreeing] == ["note"]  # 5.7x steady vs 6.0x: no warning


def test_a_window_far_from_the_steady_steps_says_so():
    explain = {"step_time_us": 952_790.0, "accounting": {"window": {"step_count": 3}}}
    far = window_note({"explain": explain, "step_time_ms": 21.3})
    assert far["severity"] == "warning"
    assert far["text"].startswith("From the 3 profiled step(s), 952.79 ms each; the run's steady "
                                  "steps took 21.30 ms: the verdict describes the profiled window")
    near = window_note({"explain": explain, "step_time_ms": 900.0})
    assert near == {"text": "From the 3 profiled step(s), 952.79 ms each.", "severity": "note"}
    assert window_note({}) is None
