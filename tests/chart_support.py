"""The plotly figures an AppTest page drew, whichever way it drew them.

Pages draw charts with pages/plot_view.draw_chart: a custom component (AppTest sees a
`bidi_component` whose data holds the figure's JSON), or `st.plotly_chart` where the
component cannot run. Tests read both the same way.
"""

from __future__ import annotations

import json

from pages.plot_view import COMPONENT_NAME


def chart_specs(at) -> list[dict]:
    """Every chart's figure (plotly JSON: data and layout), in page order."""
    specs = []
    for element in at.get("bidi_component"):
        if element.proto.component_name == COMPONENT_NAME:
            specs.append(json.loads(json.loads(element.proto.json)["figure"]))
    specs.extend(json.loads(chart.proto.spec) for chart in at.get("plotly_chart"))
    return specs


def charts_by_title(at) -> dict[str, dict]:
    """The charts keyed by their title text."""
    return {spec["layout"]["title"]["text"]: spec for spec in chart_specs(at)}
