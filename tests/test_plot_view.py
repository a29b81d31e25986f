"""pages/plot_view: which plotly.js bundle draws a figure, where the browser fetches it, and
the fallback to st.plotly_chart where the component cannot run (AppTest, a real script run)."""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest
from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

from pages import plot_view
from pages.plot_view import BUNDLES, PLOTLY_JS_VERSION, STATIC_DIR, bundle_for
from tests.chart_support import chart_specs

CHART_SCRIPT = """
import streamlit as st
import plotly.graph_objects as go
from pages.plot_view import draw_chart

draw_chart(go.Figure(go.Scatter(x=[1, 2, 3], y=[3.0, 2.0, 1.0])).update_layout(title="Loss"),
           key="loss")
left, right = st.columns(2)
draw_chart(go.Figure(go.Heatmap(z=[[1.0, 2.0], [3.0, 4.0]])).update_layout(title="Heat"),
           key="heat", container=right, eager=True)
"""


def test_line_and_bar_charts_take_the_basic_bundle_a_heatmap_the_cartesian_one():
    assert bundle_for(go.Figure([go.Scatter(y=[1, 2]), go.Bar(y=[3])])) == "basic"
    assert bundle_for(go.Figure(go.Heatmap(z=[[1, 2]]))) == "cartesian"
    assert bundle_for(go.Figure()) == "basic"  # an empty chart still draws its axes


def test_a_trace_type_no_bundle_has_is_refused_by_name():
    with pytest.raises(ValueError, match=r"scatter3d.*plot_view.BUNDLES"):
        bundle_for(go.Figure(go.Scatter3d(x=[1], y=[1], z=[1])))


def test_every_bundle_is_on_disk_at_the_version_the_url_names():
    for name, _types in BUNDLES:
        path = STATIC_DIR / f"plotly-{name}-{PLOTLY_JS_VERSION}.min.js"
        head = path.read_text(encoding="utf-8")[:200]
        # The bundle's own banner: "plotly.js (basic - minified) v4.1.1"
        assert f"plotly.js ({name} - minified) v{PLOTLY_JS_VERSION}" in head, head
    assert (STATIC_DIR / "LICENSE").read_text().startswith("MIT License")


def test_the_bundle_url_is_under_the_servers_base_path():
    saved = st_config.get_option("server.baseUrlPath")
    try:
        st_config.set_option("server.baseUrlPath", "")
        assert (
            plot_view.bundle_url("basic")
            == f"/app/static/plotly/plotly-basic-{PLOTLY_JS_VERSION}.min.js"
        )
        st_config.set_option("server.baseUrlPath", "/lab/")
        assert plot_view.bundle_url("cartesian").startswith(
            "/lab/app/static/plotly/plotly-cartesian-"
        )
    finally:
        st_config.set_option("server.baseUrlPath", saved)


def test_a_page_sends_each_figure_with_its_bundle_and_height():
    at = AppTest.from_string(CHART_SCRIPT).run()
    assert not at.exception, at.exception
    sent = [json.loads(e.proto.json) for e in at.get("bidi_component")]
    assert [data["bundle_url"].rsplit("/", 1)[1] for data in sent] == [
        f"plotly-basic-{PLOTLY_JS_VERSION}.min.js", f"plotly-cartesian-{PLOTLY_JS_VERSION}.min.js"]
    assert [data["height_px"] for data in sent] == [plot_view.DEFAULT_HEIGHT_PX] * 2
    # Drawn when in view by default; `eager` draws at once (the chart a page is opened for).
    assert [data["eager"] for data in sent] == [False, True]
    assert [spec["layout"]["title"]["text"] for spec in chart_specs(at)] == ["Loss", "Heat"]


def test_with_static_serving_off_the_same_figures_go_to_st_plotly_chart():
    saved = st_config.get_option("server.enableStaticServing")
    try:
        st_config.set_option("server.enableStaticServing", False)
        at = AppTest.from_string(CHART_SCRIPT).run()
    finally:
        st_config.set_option("server.enableStaticServing", saved)
    assert not at.exception, at.exception
    assert not at.get("bidi_component")
    assert len(at.get("plotly_chart")) == 2
    assert [spec["layout"]["title"]["text"] for spec in chart_specs(at)] == ["Loss", "Heat"]

