"""Text that is not ours is shown as text: kernel and device names from a trace, and a
run's stored reason, device name and profiler error never become Markdown (no broken-out
formatting, no image the viewer's browser would fetch)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.config import RunConfig
from engine.schema import FAILED, RUNNING, TRACE_FILENAME
from engine.store import Store
from pages.ui import plain

APP = str(Path(__file__).resolve().parent.parent / "app.py")
HOSTILE = "![x](http://attacker.example/x.png) `code` **bold** <img src=x> _u_"


def _all_markdown(at: AppTest) -> list[str]:
    found = []
    for kind in ("markdown", "error", "warning", "info", "success", "caption"):
        found += [element.value for element in getattr(at, kind)]
    return found


def _assert_literal(texts: list[str]) -> None:
    joined = "\n".join(texts)
    assert "](http://attacker.example" not in joined  # the link/image syntax is broken
    assert not re.search(r"(?<!\\)<img", joined) and "**bold**" not in joined


def test_plain_escapes_every_markdown_and_html_special():
    assert plain(HOSTILE) == ("\\!\\[x\\]\\(http://attacker.example/x.png\\) \\`code\\` "
                              "\\*\\*bold\\*\\* \\<img src=x\\> \\_u\\_")


@pytest.mark.slow
def test_live_shows_a_hostile_reason_device_and_profiler_error_as_text(home):
    store = Store(home)
    run_id = store.create_run(RunConfig(model="mlp"), "cpu", device_name=HOSTILE)
    store.set_status(run_id, RUNNING)
    store.merge_summary(run_id, {"profile_error": HOSTILE})
    store.set_status(run_id, FAILED, f"RuntimeError: {HOSTILE}")
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.session_state["live_run_id"] = run_id
    at.switch_page("pages/live.py").run()
    assert not at.exception, at.exception
    texts = _all_markdown(at)
    assert any(plain(HOSTILE) in text for text in texts)  # shown, literally
    _assert_literal(texts)


@pytest.mark.slow
def test_kernels_page_shows_hostile_kernel_and_device_names_as_text(home):
    store = Store(home)
    ids = []
    names = ("fp32 _italic_ run", "bf16 __bold__ run")  # what a name may hold: _ and ()
    for name in names:  # user-typed names head the B-vs-A section
        run_id = store.create_run(RunConfig(model="mlp", name=name), "cuda:0",
                                  device_name="test gpu")
        store.set_status(run_id, RUNNING)
        store.set_status(run_id, "finished")
        events = [{"ph": "X", "cat": "kernel",
                   "name": f"sm80_xmma_gemm_f16f16_tensorop {HOSTILE}",
                   "ts": 10.0 * i, "dur": 5.0, "pid": 0, "tid": 7,
                   "args": {"device": 0, "stream": 7, "correlation": i}} for i in range(3)]
        trace = {"deviceProperties": [{"id": 0, "name": HOSTILE, "computeMajor": 8,
                                       "computeMinor": 0}], "traceEvents": events}
        with gzip.open(store.run_dir(run_id) / TRACE_FILENAME, "wt") as handle:
            json.dump(trace, handle)
        ids.append(run_id)
    run_id = ids[0]
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["kernels_full_names"] = True  # the full kernel names' details, opened
    at.run()
    at.query_params["run"] = run_id
    at.switch_page("pages/kernels.py").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="kernels_run").value == run_id
    at.selectbox(key="kernels_compare_run").set_value(ids[1]).run()
    assert not at.exception, at.exception
    texts = _all_markdown(at) + [h.value for h in at.subheader] + [m.label for m in at.metric]
    assert f"Why B ({plain(names[1])}) against A ({plain(names[0])})" in texts
    assert not any(name in text for name in names for text in texts)  # always escaped
    _assert_literal(texts)
    assert any(HOSTILE in code.value for code in at.code)  # the full names, as a code block
    assert any("![x](http://attacker.example" in text.value for text in at.text)  # as text
