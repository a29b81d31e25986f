"""pages/plot_view's charts in Chromium: a chart out of view waits until it is scrolled to
(or idle time a second later), an `eager` one is drawn at once (Live's loss chart, whose
first point a person is waiting for even where banners push it below the window).

Needs Debian's Chromium at /usr/bin/chromium and the `playwright` package; missing
either: skipped, or failed when PRECISION_LAB_REQUIRE_BROWSER=1 (CI).
"""

from __future__ import annotations

import shutil

import pytest
from browser_support import REPO_ROOT, chromium_browser

from bench.first_point_browser import Server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SCRIPT = """import plotly.graph_objects as go
import streamlit as st

from pages.plot_view import draw_chart

st.title("Charts below the fold")
st.container(height=2500, border=False).write("Space above the charts.")
for title, eager in (("Deferred", False), ("Eager", True)):
    figure = go.Figure(go.Scatter(x=[1, 2, 3], y=[3.0, 2.0, 1.0], mode="lines+markers"))
    draw_chart(figure.update_layout(title=title), key=title.lower(), eager=eager)
"""

# True once the chart titled `title` has drawn a point of its trace.
_DRAWN_JS = """(title) => {
  for (const el of document.querySelectorAll('.js-plotly-plot')) {
    const heading = el.querySelector('.gtitle');
    if (heading && heading.textContent.trim() === title) {
      return Boolean(el.querySelector('.scatterlayer .trace .points path'));
    }
  }
  return false;
}"""


@pytest.fixture
def served_script(tmp_path):
    """The script above served by `streamlit run`, with the app's plotly.js bundles beside
    it (Streamlit serves static/ next to the script); its process group ended after."""
    script = tmp_path / "charts_app.py"
    script.write_text(SCRIPT)
    shutil.copytree(REPO_ROOT / "static", tmp_path / "static")
    server = Server(tmp_path / "home", tmp_path / "streamlit.log", script=str(script))
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


@pytest.mark.timeout(120)
def test_an_eager_chart_below_the_fold_draws_before_a_deferred_one(served_script):
    with chromium_browser() as chromium:
        page = chromium.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{served_script.url}/")
        page.wait_for_function(_DRAWN_JS, arg="Eager", polling=20, timeout=60_000)
        # Both charts are below the window: the eager one did not wait for the view.
        assert page.evaluate(_DRAWN_JS, "Deferred") is False, \
            "the deferred chart drew as early as the eager one"
        charts_top = page.evaluate(
            "() => Math.min(...[...document.querySelectorAll('.precision-lab-chart')]"
            ".map((el) => el.getBoundingClientRect().top))")
        assert charts_top > 800, f"a chart is in view (top {charts_top} px): no test"
        # No chart stays blank: the deferred one draws in idle time, unscrolled.
        page.wait_for_function(_DRAWN_JS, arg="Deferred", polling=50, timeout=30_000)
