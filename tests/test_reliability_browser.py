"""Hostile share links in a real Chromium against a real `streamlit run app.py`: every
page draws its title and no exception, and names a malformed id as text."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from browser_support import StreamlitServer, chromium_browser, exceptions, goto, main_text

from engine.config import RunConfig
from engine.schema import FINISHED
from engine.store import Store

pytestmark = pytest.mark.browser

PATHS = {"": "Launch a run", "live": "Live", "runs": "Runs", "compare": "Compare runs",
         "sweep": None, "kernels": "Kernels", "check": "GPU check"}
HOSTILE = ["../../etc", "x" * 5000, "![x](javascript:alert(1)) <b>b</b>\x00'; DROP TABLE runs"]


@pytest.fixture
def served(tmp_path):
    with chromium_browser() as browser:
        server = StreamlitServer(home=tmp_path / "lab_home", log_dir=tmp_path / "logs")
        try:
            server.start()
            store = Store(server.home)
            run_id = store.create_run(RunConfig(model="mlp", name="target"), "cpu")
            store.set_status(run_id, FINISHED)
            store.merge_summary(run_id, {"cpu_evidence": {
                "verdict": "not applicable", "headline": "fp32 run", "evidence": [],
                "primitives": []}})
            sweep_id = store.create_sweep({"models": ["mlp"], "precisions": ["fp32"],
                                           "batch_sizes": [8], "size": "tiny", "steps": 6},
                                          "local")
            store.link_sweep_run(sweep_id, run_id, 0)
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            context.set_default_timeout(30_000)
            yield server, context
            context.close()
        finally:
            server.stop()


@pytest.mark.timeout(600)
def test_hostile_share_links_draw_every_page_without_an_exception(served):
    server, context = served
    failures = []
    for value in HOSTILE:
        query = urlencode({param: value for param in
                           ("run", "runs", "baseline", "relaunch", "sweep")})
        for path, title in PATHS.items():
            tab = context.new_page()  # a fresh session: a shared link's first visit
            try:
                goto(tab, f"{server.url}/{path}?{query}", title)
                if exceptions(tab):
                    failures.append((path, value[:30], exceptions(tab)[0][:200]))
                elif path in ("live", "compare", "kernels") and "not run ids" not in main_text(tab):
                    failures.append((path, value[:30], "the malformed id is not named"))
            finally:
                tab.close()
    assert not failures, failures
