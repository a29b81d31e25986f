"""Every chart a page draws: a plotly figure drawn by a partial plotly.js bundle.

Why not `st.plotly_chart`: Streamlit's chart element loads the full plotly.js (4.7 MB of
JavaScript) the first time a tab draws a chart, and compiling it is most of every chart
page's time on a small machine (measured in Chromium on a 2-core machine: 0.95-1.1 s to
first draw with the full bundle, 0.25-0.3 s with the basic bundle (scatter, bar), 0.45-0.5 s
with the cartesian one (heatmap too); docs/architecture.md, "Where a chart is drawn").
So a page's figure goes to a small custom component instead, which loads the smallest
bundle that has the figure's trace types from `static/plotly/` (Streamlit's static file
serving) once per tab and draws it with `Plotly.react`, so a refresh (Live, every second)
updates the chart in place. A chart out of view is drawn when it scrolls into view, when
the page is printed, or in idle time a second after the page drew: the charts a person
sees first are not kept waiting behind the ones below the fold.

The bundles are plotly.js's own distributions, the version plotly.py ships
(static/plotly/README.md). Where the component cannot run (static serving switched off
in the server's config, a Streamlit without components v2) the figure goes to
`st.plotly_chart`: the same figure, slower to first draw.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import plotly.io as pio
import streamlit as st

from engine.report.figures import PLOT_TEMPLATE, PLOTLY_CONFIG

# Importing Streamlit made its own template plotly's default: every figure a page builds
# uses the product's one template instead (and is drawn with theme=None), so the browser
# shows exactly the figure the layout tests and the HTML report have. Set here, not in
# pages/ui.py: every page that builds a figure imports this module first, and a page
# without charts (Launch, a server's usual first page) never pays plotly's import
# (0.3-0.6 s of the first script run on a 2-core machine).
pio.templates.default = PLOT_TEMPLATE

PLOTLY_JS_VERSION = "4.1.1"
STATIC_DIR = Path(__file__).resolve().parent.parent / "static" / "plotly"
# The bundle for a figure: the first whose trace types cover all of the figure's.
BUNDLES = (
    ("basic", frozenset({"scatter", "bar", "pie"})),
    ("cartesian", frozenset({"scatter", "bar", "pie", "box", "heatmap", "histogram",
                             "histogram2d", "histogram2dcontour", "contour", "violin",
                             "image"})),
)
DEFAULT_HEIGHT_PX = 450  # plotly's own default, used when a figure sets none

COMPONENT_NAME = "precision_lab_plotly"
_HTML = '<div class="precision-lab-chart" style="width:100%"></div>'

# One promise per bundle and tab: the bundle is loaded and compiled once, then every
# chart of every page the tab visits draws with it. It is loaded with a <script> tag, so
# the browser keeps its compiled code between tabs and visits (Chromium's code cache: a
# new tab's first chart 110-130 ms instead of 240-250 ms with a profile, measured here);
# the tag's `window.Plotly` is taken and removed at once, so the basic and the cartesian
# bundle in one tab do not overwrite each other. Where the tag cannot give a Plotly (the
# server sends .js as another content type, or the page has an AMD `define`, which the UMD
# bundle would register with instead) it is fetched as text and evaluated with a
# `module` of its own: the same bundle, compiled anew in every tab.
_JS = r"""
function loadByTag(url) {
  return new Promise((resolve, reject) => {
    const script = document.createElement("script");
    const hadPlotly = Object.prototype.hasOwnProperty.call(window, "Plotly");
    script.src = url;
    script.async = true;
    script.onload = () => {
      const Plotly = window.Plotly;
      if (!hadPlotly) delete window.Plotly;
      script.remove();
      if (Plotly && typeof Plotly.react === "function") resolve(Plotly);
      else reject(new Error(url + " defined no window.Plotly"));
    };
    script.onerror = () => {
      script.remove();
      reject(new Error(url + " did not load as a script"));
    };
    document.head.appendChild(script);
  });
}

function loadAsModule(url) {
  return fetch(url)
    .then((response) => {
      if (!response.ok) throw new Error(url + " answered HTTP " + response.status);
      return response.text();
    })
    .then((source) => {
      const module = { exports: {} };
      new Function("module", "exports", source)(module, module.exports);
      return module.exports;
    });
}

function loadPlotly(url) {
  const cache = (window.__precisionLabPlotly = window.__precisionLabPlotly || {});
  if (!cache[url]) {
    // How each bundle came in ("script" or "module"), for a look in the browser's console
    const how = (window.__precisionLabPlotlyLoadedBy = window.__precisionLabPlotlyLoadedBy || {});
    cache[url] = loadByTag(url)
      .then((Plotly) => ((how[url] = "script"), Plotly))
      .catch(() => loadAsModule(url).then((Plotly) => ((how[url] = "module"), Plotly)));
    cache[url].catch(() => delete cache[url]);
  }
  return cache[url];
}

// A chart waits until a person can see it: drawn when it is in (or scrolls into) view, when
// the page is printed, or, so that no chart stays blank, in idle time once what is in view
// has had DEFER_MS. On a 2-core machine each chart costs the browser 70-150 ms, and a page's
// charts drew in one task at the end of its load (Chromium trace of Compare with 20 runs:
// 353 ms for 3 charts, one of them below the fold; Live of a finished run draws 5, 2 in
// view at 1280x800). The space is reserved at once (the height), so nothing moves.
const DEFER_MS = 1000;

function whenShown(root) {
  if (typeof IntersectionObserver !== "function") return { shown: Promise.resolve(), cancel() {} };
  let cancel = () => {};
  const shown = new Promise((resolve) => {
    let timer = null;
    let idle = null;
    const show = () => {
      cancel();
      resolve();
    };
    const observer = new IntersectionObserver((entries) => {
      if (entries.some((entry) => entry.isIntersecting)) show();
    });
    cancel = () => {
      observer.disconnect();
      clearTimeout(timer);
      if (idle !== null && typeof cancelIdleCallback === "function") cancelIdleCallback(idle);
      window.removeEventListener("beforeprint", show);
    };
    observer.observe(root);
    window.addEventListener("beforeprint", show);
    timer = setTimeout(() => {
      if (typeof requestIdleCallback !== "function") return show();
      idle = requestIdleCallback(show, { timeout: 2000 });
    }, DEFER_MS);
  });
  return { shown, cancel: () => cancel() };
}

export default function ({ parentElement, data }) {
  const root = parentElement.querySelector(".precision-lab-chart");
  const figure = JSON.parse(data.figure);
  root.style.height = data.height_px + "px";
  let current = true;
  const view = data.eager ? { shown: Promise.resolve(), cancel() {} } : whenShown(root);
  Promise.all([loadPlotly(data.bundle_url), view.shown])
    .then(([Plotly]) => {
      if (!current) return;
      if (!root.classList.contains("js-plotly-plot")) root.textContent = "";
      return Plotly.react(root, figure.data || [], figure.layout || {}, data.config);
    })
    .catch((error) => {
      if (current) root.textContent = "The chart could not be drawn: " + error.message;
    });
  return () => {
    current = false;
    view.cancel();
    // Called when the element leaves the page; free plotly's listeners then, not on a
    // refresh of the same chart.
    setTimeout(() => {
      if (!root.isConnected && window.__precisionLabPlotly) {
        loadPlotly(data.bundle_url).then((Plotly) => Plotly.purge(root)).catch(() => {});
      }
    }, 0);
  };
}
"""


def _component():
    """The registered component, or None where this Streamlit cannot mount one."""
    v2 = getattr(st.components, "v2", None)
    if v2 is None:
        return None
    return v2.component(COMPONENT_NAME, html=_HTML, js=_JS, isolate_styles=False)


_CHART_COMPONENT = _component()


def bundle_for(figure) -> str:
    """The smallest bundle that draws every trace type in `figure`."""
    types = {trace.type for trace in figure.data}
    for name, covers in BUNDLES:
        if types <= covers:
            return name
    raise ValueError(f"no plotly.js bundle in {STATIC_DIR} draws trace types "
                     f"{sorted(types - BUNDLES[-1][1])}; add one to pages/plot_view.BUNDLES")


def bundle_url(name: str) -> str:
    """Where the browser fetches a bundle: Streamlit's static route under the server's
    base path."""
    base = (st.get_option("server.baseUrlPath") or "").strip("/")
    prefix = f"/{base}" if base else ""
    return f"{prefix}/app/static/plotly/plotly-{name}-{PLOTLY_JS_VERSION}.min.js"


def component_ready() -> bool:
    """True where the component can draw: components v2 and static serving on."""
    return _CHART_COMPONENT is not None and bool(st.get_option("server.enableStaticServing"))


def draw_chart(figure, key: str, container=None, eager: bool = False) -> None:
    """Draw `figure` (a plotly Figure, drawn as built: theme=None) in `container` (a column
    or other Streamlit container; the page itself when None).

    `eager`: drawn as soon as plotly is loaded, in view or not. For the chart a page is
    opened to watch (Live's loss): where banners above push it past the bottom of the
    window, waiting for the view would hold its first point back by the deferral (1 s,
    then idle time: up to 2.5 s more on a busy 2-core machine)."""
    if not component_ready():
        (container or st).plotly_chart(figure, theme=None, key=key, config=PLOTLY_CONFIG)
        return
    height_px = figure.layout.height or DEFAULT_HEIGHT_PX
    data = {"figure": pio.to_json(figure, validate=False), "config": PLOTLY_CONFIG,
            "bundle_url": bundle_url(bundle_for(figure)), "height_px": height_px,
            "eager": eager}
    with container if container is not None else nullcontext():
        _CHART_COMPONENT(data=data, key=key)
