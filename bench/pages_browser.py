"""Navigation -> the page's main element drawn and idle, for every page, in a real browser.

    python -m bench.pages_browser [--repeats 3] [--quick] [--incognito] [--json]

bench.ui times the server-side script run (< 300 ms); a person waits for more: the
script's start, its imports, the websocket messages, plotly's payload and drawing. This
benchmark times what a person sees: a `streamlit run app.py` server on a private data
directory (bench/_dataset.py's finished runs, copied, plus one run with a real V100
profiler trace and one run training now), Chromium (Playwright, /usr/bin/chromium, never a
downloaded browser; a new, empty profile, which keeps compiled JavaScript between tabs as
a person's browser does; `--incognito`: none) opening each page in a new tab (a new
session, as a shared link does), and the clock stopped when the page's main element is
drawn and the script is idle (`data-test-script-state="notRunning"`; Live of a running
run refreshes every second, so there only the drawn chart counts). A chart page is ready
when every chart in the 1280x800 view is drawn: the app draws the ones below the fold when
scrolled to or a second later (pages/plot_view.py), so they are not waited for. Each of
these conditions is checked in the page every 20 ms (READY_POLL_MS): until 2026-12-06 the
benchmark waited with Playwright's wait_for_selector, whose checks back off to one every
500 ms, which added 0-0.5 s to a visit (a bare page read 0.92 s, 0.51 s checked this way).

Pages: Launch (the server's first page: its cold start is reported on its own), Live
running, Live finished, Runs (200 runs), Compare with 3 and with 20 runs, Kernels with a
real trace, the HTML report of 3 runs opened from disk. Then click -> first point on the
Live page (bench.first_point_browser's measurement), once right after the server's
first page (first launch) and then warm, in turn with Launch opened by its address (a new
page load) and from the Live page's sidebar (how a person goes on to the next run; the tab
keeps the JavaScript it has loaded, plotly among it).

Each visit is also split where the time went, from the times the page's websocket opened
and last received a message before the page was ready (page clock): the page's start
(HTML, Streamlit's JavaScript), the server's script run, and the browser's drawing after
the last message.

Beside them, in the same run and browser, Streamlit's own floor on this machine: a second
server of a bare app (a title and a button; the same with one plotly chart of 1,000 points,
by st.plotly_chart and as the app's pages draw it (pages/plot_view.py: the basic bundle);
the same with 40 widgets, as many as the Launch form; the same with one table of 200 rows,
as Runs), so each page's time reads against what any Streamlit page costs here. The bare
app's server's first page, opened in a browser launched for it, is the floor of the app
server's first page (the benchmark browser's first page).

Goals: every page < 1.5 s; click -> first point < 1.5 s warm, < 3 s on the first launch.
Without Chromium or Playwright it says so and exits 3.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from bench._common import REPO_ROOT, emit_json, machine_info, print_table, spread
from bench.first_point_browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    EXIT_NO_BROWSER,
    Server,
    browser_missing,
    end_standbys,
    one_launch,
    stop_runs,
    wait_standby,
)

PAGE_GOAL_S = 1.5
LIVE_RUNNING = "Live, running run (its trainer using the CPU)"
COLD_LAUNCH = "Launch, first page of the server"
WARM_WAYS = {"address": "Launch opened by its address",
             "sidebar": "Launch opened from the sidebar"}
FIRST_POINT_WARM_GOAL_S = 1.5
FIRST_POINT_FIRST_GOAL_S = 3.0
STORE_RUNS, STORE_STEPS = 200, 1_000
VIEWPORT = {"width": 1280, "height": 800}
PAGE_TIMEOUT_MS = 60_000
KERNEL_TRACE = REPO_ROOT / "tests" / "data" / "traces" / "v100_resnet50_kineto_v1.json.gz"
IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'

# Every "ready" is one function polled in the page every READY_POLL_MS. Playwright's
# wait_for_selector re-checks on a backoff (20, 50, 100, 100 ms, then every 500 ms), so a
# page drawn just after a check was seen up to 0.5 s late: a bare page's button drawn at
# 462 ms (page clock, MutationObserver) was seen at 919 ms, and its visits read 0.46 or
# 0.93 s by where the drawing fell between two checks.
READY_POLL_MS = 20

# True once an element matching `selector` (and holding `text`, when given) is shown,
# `charts` plotly charts have drawn their first trace (a marker or a line vertex) and so has
# every chart in view (the app draws the ones out of view when scrolled to, or a second
# later: pages/plot_view.py, as a person sees them), and, with `idle` (IDLE), the script is
# idle.
_READY_JS = """([selector, text, charts, idle]) => {
  const shown = (el) => el.getClientRects().length > 0
    && getComputedStyle(el).visibility !== 'hidden';
  const found = [...document.querySelectorAll(selector)]
    .some((el) => shown(el) && (!text || el.textContent.includes(text)));
  if (!found) return false;
  const drawn = (el) => {
    const trace = el.querySelector('.scatterlayer .trace, .barlayer .trace, .heatmaplayer');
    return Boolean(trace && trace.querySelector('.points path, .point, image, path.js-line'));
  };
  const inView = (el) => {
    const box = el.getBoundingClientRect();
    return box.bottom > 0 && box.top < window.innerHeight && box.height > 0;
  };
  const plots = [...document.querySelectorAll('.js-plotly-plot')];
  const waiting = [...document.querySelectorAll('.precision-lab-chart')]
    .filter((el) => inView(el) && !drawn(el));
  if (plots.filter(drawn).length < charts || waiting.length > 0) return false;
  return !idle || document.querySelector(idle) !== null;
}"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.pages_browser", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="visits per page (default 3)")
    parser.add_argument("--launches", type=int, default=5,
                        help="click -> first point launches (default 5: the first, then warm "
                             "ones in turn with Launch opened by its address and from the "
                             "sidebar)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 1 visit per page, 3 launches, 40 runs in the store")
    parser.add_argument("--incognito", action="store_true",
                        help="browse without a profile: every tab compiles Streamlit's and "
                             "plotly's JavaScript anew (the method before 2026-12-04)")
    parser.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    parser.add_argument("--server-log", metavar="PATH",
                        help="keep the app server's log here (it is deleted with the store)")
    args = parser.parse_args(argv)
    args.store_runs = STORE_RUNS
    if args.quick:
        args.repeats, args.launches, args.store_runs = 1, 3, 40
    return args


# ---------------------------------------------------------------------------------------
# the store


def prepare_store(home: Path, runs: int) -> dict[str, Any]:
    """bench/_dataset.py's cached finished runs copied to `home`, plus a run carrying a real
    GPU profiler trace (for Kernels) and the HTML report of three runs."""
    from bench._dataset import cached_store
    from engine.config import RunConfig
    from engine.report.html import export_html
    from engine.schema import FINISHED, TRACE_FILENAME
    from engine.store import Store

    cached, info = cached_store(runs, STORE_STEPS)
    shutil.copytree(cached, home)
    store = Store(home)
    config = RunConfig(model="gpt", size="tiny", precision="bf16-amp", batch_size=16, steps=10,
                       profile=True, name="V100 ResNet-50 trace")
    kernel_run = store.create_run(config, "cuda:0", "Tesla V100-SXM2-16GB", run_id="bench-kernels")
    shutil.copyfile(KERNEL_TRACE, store.run_dir(kernel_run) / TRACE_FILENAME)
    store.set_status(kernel_run, FINISHED)
    run_ids = list(info["run_ids"])
    report_path = home.parent / "report.html"
    export_html(store, run_ids[:3], report_path)
    return {"run_ids": run_ids, "kernel_run": kernel_run, "report": report_path,
            "dataset": {k: v for k, v in info.items() if k != "run_ids"}}


def start_running_run(store) -> str:
    """A real run training now (gpt tiny, many steps), for Live of a running run."""
    from engine.config import RunConfig
    from engine.run.launcher import launch

    config = RunConfig(model="gpt", size="tiny", precision="fp32", batch_size=8,
                       steps=1_000_000, profile=False, name="bench running")
    return launch(config, store)


# ---------------------------------------------------------------------------------------
# Streamlit's floor: what any page costs here, before this app adds anything

FLOOR_APP = """import pandas as pd
import plotly.graph_objects as go
import streamlit as st

st.title("Floor")
if st.query_params.get("chart"):
    st.plotly_chart(go.Figure(go.Scatter(x=list(range(1000)), y=[i % 7 for i in range(1000)])))
if st.query_params.get("component"):  # the same chart, drawn as the app's pages draw one
    from pages.plot_view import draw_chart
    draw_chart(go.Figure(go.Scatter(x=list(range(1000)), y=[i % 7 for i in range(1000)])), key="c")
if st.query_params.get("table"):  # as many rows and columns as Runs with 200 runs
    st.dataframe(pd.DataFrame({f"column {c}": [f"{r * c}" for r in range(200)] for c in range(10)}))
left, right = st.columns(2)
for i in range(int(st.query_params.get("widgets", 0))):  # as many as the Launch form has
    column = (left, right)[i % 2]
    if i % 3 == 0:
        column.selectbox(f"Select {i}", ["a", "b", "c"], key=f"select{i}", help="help")
    elif i % 3 == 1:
        column.number_input(f"Number {i}", value=3, key=f"number{i}", help="help")
    else:
        column.checkbox(f"Check {i}", key=f"check{i}")
st.button("Go")
"""


def measure_floor(chromium, context, tmp: Path, repeats: int, phases: dict[str, list],
                  incognito: bool) -> dict[str, list[float]]:
    """Navigation -> drawn and idle for a bare Streamlit page, and the same with a plotly
    chart, 40 widgets or a 200-row table, from a server of its own (the same Streamlit,
    browser and machine as the app's). Each visit's split is appended to `phases`.

    The floor server's first page is opened in a browser of its own, launched for it, as
    the app server's first page is the first page of the benchmark's browser: a new
    server's first page in a new browser, which no app can beat (FLOOR_COLD)."""
    script = tmp / "floor_app.py"
    script.write_text(FLOOR_APP)
    # Streamlit serves static/ beside the script: the app's plotly.js bundles, for the
    # chart drawn as the pages draw one.
    shutil.copytree(REPO_ROOT / "static", tmp / "static", dirs_exist_ok=True)
    server = Server(tmp / "floor_home", tmp / "floor.log", script=str(script))
    go_button = idle_with("button", text="Go")
    variants = {FLOOR_BARE: ("/", go_button),
                FLOOR_CHART: ("/?chart=1", idle_with(".js-plotly-plot", 1)),
                FLOOR_APP_CHART: ("/?component=1", idle_with(".js-plotly-plot", 1)),
                FLOOR_WIDGETS: ("/?widgets=40", go_button),
                FLOOR_TABLE: ("/?table=1", idle_with('[data-testid="stDataFrame"]'))}
    try:
        server.wait_healthy()
        phases[FLOOR_COLD] = []
        with open_browser(chromium, tmp / "floor_profile", incognito) as fresh:
            times = {FLOOR_COLD: [visit(fresh, f"{server.url}/", go_button,
                                        phases[FLOOR_COLD])]}
        for name, (path, ready) in variants.items():
            phases[name] = []
            times[name] = [visit(context, server.url + path, ready, phases[name])
                           for _ in range(repeats)]
        return times
    finally:
        server.stop()


FLOOR_BARE = "floor: bare Streamlit page (title + button)"
FLOOR_COLD = "floor: bare page, its server's first page, in a new browser"
FLOOR_CHART = "floor: bare page + one plotly chart (st.plotly_chart)"
FLOOR_APP_CHART = "floor: bare page + the same chart as the pages draw it (basic bundle)"
FLOOR_WIDGETS = "floor: bare page + 40 widgets"
FLOOR_TABLE = "floor: bare page + one table of 200 rows"


# ---------------------------------------------------------------------------------------
# one visit


# Installed in every tab before the page's own scripts: the times (page clock, ms) the
# app's websocket opened and received each message, so a visit splits into the page's
# start, the server's script run and the browser's drawing.
_SOCKET_CLOCK_JS = """(() => {
  const Native = window.WebSocket;
  window.__benchSocket = {opened: null, last: null};
  const clock = window.__benchSocket;
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener('open', () => { clock.opened = performance.now(); });
      this.addEventListener('message', () => { clock.last = performance.now(); });
    }
  };
})();"""
_SOCKET_READ_JS = "() => ({...(window.__benchSocket || {}), now: performance.now()})"


@contextmanager
def open_browser(chromium, profile_dir: Path, incognito: bool):
    """A new Chromium, as a browser context with the socket clock in every tab; closed on
    leaving.

    By default with a profile of its own (an empty directory), as a person's browser has:
    Chromium then keeps the JavaScript it compiled (Streamlit's, plotly.js) for the next
    tab, as a person's browser does for the next visit. With `incognito`, a context
    without one, which compiles every script anew in every tab (this benchmark's method
    until 2026-12-04: use it to compare with figures measured then)."""
    browser = None
    if incognito:
        browser = chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport=VIEWPORT)
    else:
        context = chromium.launch_persistent_context(
            str(profile_dir), executable_path=CHROMIUM, args=CHROMIUM_ARGS, viewport=VIEWPORT)
    try:
        context.add_init_script(_SOCKET_CLOCK_JS)
        yield context
    finally:
        context.close()
        if browser is not None:
            browser.close()


def visit(context, url: str, ready: Callable[[Any], None], phases: list | None = None) -> float:
    """Seconds from navigation (a new tab) to `ready` returning; the tab is closed after.
    With `phases`, appends where the time went (`split_visit`)."""
    page = context.new_page()
    try:
        started = time.perf_counter()
        page.goto(url, wait_until="commit", timeout=PAGE_TIMEOUT_MS)
        ready(page)
        seconds = time.perf_counter() - started
        if phases is not None:
            phases.append(split_visit(page.evaluate(_SOCKET_READ_JS)))
        return seconds
    finally:
        page.close()


PHASES = {"start_s": "HTML, Streamlit's JavaScript, socket open",
          "script_s": "socket open -> last message (the server's run, and the browser "
                      "drawing each message as it arrives)",
          "drawing_s": "last message -> drawn and idle"}


def split_visit(clock: dict) -> dict[str, float | None]:
    """A visit in three parts (s, page clock): until the socket opened; until the last
    message before the page was ready (the server's script run, with the browser drawing
    the messages as they arrive: both share the 2 cores); the drawing after it. None where
    the page has no socket (the HTML report)."""
    if clock.get("opened") is None or clock.get("last") is None:
        return dict.fromkeys(PHASES)
    return {"start_s": clock["opened"] / 1000, "script_s": (clock["last"] - clock["opened"]) / 1000,
            "drawing_s": (clock["now"] - clock["last"]) / 1000}


def idle_with(selector: str, charts: int = 0, text: str = "") -> Callable[[Any], None]:
    """Ready when an element matching the CSS `selector` (holding `text`, when given) is
    shown, `charts` plotly charts have drawn and the script is idle."""
    return _ready(selector, text, charts, IDLE)


def charts_only(charts: int) -> Callable[[Any], None]:
    """Ready when `charts` plotly charts have drawn (Live of a running run is never idle:
    it refreshes every second; the HTML report has no script)."""
    return _ready(".js-plotly-plot", "", charts, "")


def _ready(selector: str, text: str, charts: int, idle: str) -> Callable[[Any], None]:
    def ready(page) -> None:
        page.wait_for_function(_READY_JS, arg=[selector, text, charts, idle],
                               polling=READY_POLL_MS, timeout=PAGE_TIMEOUT_MS)
    return ready


def settle(store) -> None:
    """Stop every run, then wait for the successor standby to have imported torch (~3 s of
    CPU on 2 cores): no page visit or launch is timed while it does."""
    stop_runs(store)
    wait_standby(store.home)


def scenarios(url: str, prepared: dict[str, Any]) -> dict[str, tuple[str, Callable]]:
    """The pages visited with no run training (the machine quiet but for the browser and
    the server); Live of a running run is visited on its own, with its trainer."""
    run_ids = prepared["run_ids"]
    table = '[data-testid="stDataFrame"]'
    return {
        "Launch": (f"{url}/", idle_with("button", text="Launch run")),
        "Live, finished run": (f"{url}/live?run={run_ids[0]}", idle_with(".js-plotly-plot", 2)),
        f"Runs, {len(run_ids) + 2} runs": (f"{url}/runs", idle_with(table)),
        "Compare, 3 runs": (f"{url}/compare?runs={','.join(run_ids[:3])}",
                            idle_with(table, 1)),
        "Compare, 20 runs": (f"{url}/compare?runs={','.join(run_ids[:20])}",
                             idle_with(table, 1)),
        "Kernels, V100 trace": (f"{url}/kernels?run={prepared['kernel_run']}",
                                idle_with(table)),
        "HTML report, 3 runs": (prepared["report"].as_uri(), charts_only(1)),
    }


# ---------------------------------------------------------------------------------------


def measure(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    from engine.run import standby
    from engine.store import Store

    prepared = prepare_store(home, args.store_runs)
    store = Store(home)
    server = Server(home, home.parent / "streamlit.log")
    pages: dict[str, list[float]] = {}
    floor: dict[str, list[float]] = {}
    phases: dict[str, list[dict]] = {}
    launches: list[dict[str, Any]] = []
    try:
        server_started = time.perf_counter()
        server.wait_healthy()
        with sync_playwright() as playwright:
            with open_browser(playwright.chromium, home.parent / "profile",
                              args.incognito) as context:
                phases[COLD_LAUNCH] = []
                cold_s = visit(context, f"{server.url}/",
                               idle_with("button", text="Launch run"), phases[COLD_LAUNCH])
                cold_from_start_s = time.perf_counter() - server_started
                launch_page = context.new_page()
                launches.append(one_launch(launch_page, server, store))  # the first launch
                settle(store)
                for name, (url, ready) in scenarios(server.url, prepared).items():
                    phases[name] = []
                    pages[name] = [visit(context, url, ready, phases[name])
                                   for _ in range(args.repeats)]
                # A trainer takes both cores of a small machine: only this page sees it.
                running_id = start_running_run(store)
                pages[LIVE_RUNNING] = [visit(context, f"{server.url}/live?run={running_id}",
                                             charts_only(1)) for _ in range(args.repeats)]
                settle(store)
                for number in range(max(0, args.launches - 1)):
                    launches.append(one_launch(launch_page, server, store,
                                               via_sidebar=number % 2 == 1))
                    settle(store)
                floor = measure_floor(playwright.chromium, context, home.parent,
                                      args.repeats, phases, args.incognito)
    finally:
        server.stop()
        stop_runs(store)
        end_standbys(home, standby)
    return {"pages": pages, "floor": floor, "phases": phases, "cold_launch_page_s": cold_s,
            "server_start_to_first_page_s": cold_from_start_s, "launches": launches,
            "dataset": prepared["dataset"], "store_runs": len(prepared["run_ids"]) + 2}


def summarize(measured: dict[str, Any]) -> dict[str, Any]:
    pages = {name: spread(times) | {"first": times[0] if times else None}
             for name, times in measured["pages"].items()}
    first = measured["launches"][:1]
    warm = measured["launches"][1:]
    point = {"first_launch_s": first[0]["click_to_visible_s"] if first else None,
             "warm": spread(launch["click_to_visible_s"] for launch in warm),
             **{f"warm_{way}": spread(launch["click_to_visible_s"] for launch in warm
                                      if launch["via"] == way) for way in ("address", "sidebar")}}
    missed = [name for name, figures in pages.items()
              if figures["median"] is None or figures["median"] >= PAGE_GOAL_S]
    if measured["cold_launch_page_s"] >= PAGE_GOAL_S:
        missed.append(COLD_LAUNCH)
    if point["first_launch_s"] is None or point["first_launch_s"] >= FIRST_POINT_FIRST_GOAL_S:
        missed.append("click -> first point, first launch")
    for way, words in WARM_WAYS.items():
        median = point[f"warm_{way}"]["median"]  # None: not measured, so not met either
        if median is None or median >= FIRST_POINT_WARM_GOAL_S:
            missed.append(f"click -> first point, warm, {words}")
    floor = {name: spread(times) for name, times in measured.get("floor", {}).items()}
    bare = (floor.get(FLOOR_BARE) or {}).get("median")
    # each page against the bare Streamlit page, measured side by side in this run
    x_floor = {name: (figures["median"] / bare if bare and figures["median"] else None)
               for name, figures in pages.items()}
    # a server's first page against a bare app's server's first page
    bare_cold = (floor.get(FLOOR_COLD) or {}).get("median")
    x_floor[COLD_LAUNCH] = (measured["cold_launch_page_s"] / bare_cold if bare_cold else None)
    # where each page's time went: the median of each part over its visits
    split = {name: {part: spread(visit_split[part] for visit_split in visits)["median"]
                    for part in PHASES}
             for name, visits in measured.get("phases", {}).items()}
    return {"pages": pages, "first_point": point, "missed": missed, "floor": floor,
            "x_floor": x_floor, "phases": split}


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = browser_missing()
    if missing:
        print(f"bench.pages_browser: {missing}", file=sys.stderr)
        return EXIT_NO_BROWSER
    machine = machine_info()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_pages_browser_") as tmp:
        try:
            measured = measure(args, Path(tmp) / "home")
        finally:
            if args.server_log and (Path(tmp) / "streamlit.log").exists():
                shutil.copyfile(Path(tmp) / "streamlit.log", args.server_log)
    elapsed_s = time.monotonic() - started
    summary = summarize(measured)
    print(f"bench.pages_browser: Chromium at {VIEWPORT['width']}x{VIEWPORT['height']}, "
          f"{args.repeats} visit(s) per page, {measured['store_runs']} runs in the store; "
          f"{elapsed_s:.1f} s; load avg at start {machine['load_avg_1_5_15_min']}")
    rows = [[COLD_LAUNCH, measured["cold_launch_page_s"], None, None, None, 1,
             summary["x_floor"][COLD_LAUNCH]]]
    rows += [[name, f["median"], f["first"], f["min"], f["max"], f["n"], summary["x_floor"][name]]
             for name, f in summary["pages"].items()]
    rows += [[name, f["median"], None, f["min"], f["max"], f["n"], None]
             for name, f in summary["floor"].items()]
    print_table(f"Seconds from navigation to drawn and idle (goal < {PAGE_GOAL_S} s); "
                "x floor: against the bare Streamlit page, same run (a server's first "
                "page: against the bare page's server's first page)",
                ["page", "median", "first", "min", "max", "n", "x floor"], rows)
    print_table("Where the time went (median s): " + "; ".join(
                    f"{part.removesuffix('_s')} = {words}" for part, words in PHASES.items()),
                ["page", *(part.removesuffix("_s") for part in PHASES)],
                [[name, *(split[part] for part in PHASES)]
                 for name, split in summary["phases"].items()])
    point = summary["first_point"]
    print(f"\nclick -> first point: first launch {point['first_launch_s']:.2f} s (goal < "
          f"{FIRST_POINT_FIRST_GOAL_S} s); warm (goal < {FIRST_POINT_WARM_GOAL_S} s): "
          + "; ".join(f"{words}, median {_seconds(point[f'warm_{way}']['median'])} "
                      f"(n={point[f'warm_{way}']['n']})" for way, words in WARM_WAYS.items()))
    missed = summary["missed"]
    print("goals: " + ("MISSED by " + ", ".join(missed) if missed else "met"))
    if args.json:
        emit_json({"benchmark": "pages_browser", "target": PAGE_GOAL_S, "target_op": "<",
                   "met": not summary["missed"], "missed": summary["missed"],
                   "page_s": {name: f["median"] for name, f in summary["pages"].items()},
                   "cold_launch_page_s": measured["cold_launch_page_s"],
                   "server_start_to_first_page_s": measured["server_start_to_first_page_s"],
                   "first_point": point, "results": summary["pages"],
                   "floor": summary["floor"], "x_floor": summary["x_floor"],
                   "phases": summary["phases"],
                   "launches": measured["launches"], "dataset": measured["dataset"],
                   "config": {"viewport": VIEWPORT, "repeats": args.repeats,
                              "incognito": args.incognito,
                              "store_runs": measured["store_runs"]},
                   "repeats": args.repeats, "elapsed_s": elapsed_s, "machine": machine})
    return 0


if __name__ == "__main__":
    sys.exit(main())
