"""The plotly figures an AppTest page drew, whichever way it drew them.

Pages draw charts with pages/plot_view.draw_chart: a custom component (AppTest sees a
`bidi_component` whose data holds the figure's JSON), or `st.plotly_chart` where the
component cannot run. Tests read both the same way.
"""

from __future__ import annotations

import base64
import json

import numpy as np

from pages.plot_view import COMPONENT_NAME


def decoded(value):
    """plotly's JSON with its typed arrays ({"dtype", "bdata"[, "shape"]}: how plotly.py
    sends numpy arrays, base64 of the raw bytes) turned back into lists."""
    if isinstance(value, dict):
        if set(value) <= {"dtype", "bdata", "shape"} and {"dtype", "bdata"} <= set(value):
            array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
            if "shape" in value:
                shape = value["shape"]
                shape = [int(n) for n in shape.split(",")] if isinstance(shape, str) else shape
                array = array.reshape(shape)
            return array.tolist()
        return {key: decoded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decoded(item) for item in value]
    return value


def chart_specs(at) -> list[dict]:
    """Every chart's figure (plotly JSON: data and layout), in page order."""
    specs = []
    for element in at.get("bidi_component"):
        if element.proto.component_name == COMPONENT_NAME:
            specs.append(decoded(json.loads(json.loads(element.proto.json)["figure"])))
    specs.extend(decoded(json.loads(chart.proto.spec)) for chart in at.get("plotly_chart"))
    return specs


def charts_by_title(at) -> dict[str, dict]:
    """The charts keyed by their title text."""
    return {spec["layout"]["title"]["text"]: spec for spec in chart_specs(at)}
