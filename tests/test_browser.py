"""The app in a real browser: a real `streamlit run` server driven by Chromium (Playwright).

What AppTest cannot show: the pages render in a browser without a Streamlit exception,
the form's real widgets launch a run, the Live fragment's timer redraws the loss chart
in the page, the Stop button ends the worker, and a server restart mid-run neither loses
nor duplicates the run.

Needs Debian's Chromium at /usr/bin/chromium and the `playwright` package (never
`playwright install`). Missing either: skipped, or failed when
PRECISION_LAB_REQUIRE_BROWSER=1 (CI). PRECISION_LAB_SCREENSHOTS=1 writes the README's
screenshots to docs/screenshots/ (else they go to the test's tmp dir).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from browser_support import (
    REPO_ROOT,
    StreamlitServer,
    chart_points,
    chart_titles,
    choose,
    chromium_browser,
    error_alerts,
    exceptions,
    goto,
    grid_cells,
    grid_columns,
    main_text,
    screenshot,
    set_number,
    stop_all_runs,
    wait_app_idle,
    wait_for,
    widget,
    worker_groups,
    worker_processes,
)

pytestmark = pytest.mark.browser

TITLES = {"": "Launch a run", "live": "Live", "runs": "Runs"}  # url path -> st.title
LIVE_URL = re.compile(r"/live\?run=[A-Za-z0-9_-]+")


# ---------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def browser():
    with chromium_browser() as chromium:
        yield chromium


@pytest.fixture
def server(browser, tmp_path):
    """A `streamlit run app.py` on a free port with its own PRECISION_LAB_HOME (after the
    browser: no server is started just to skip).

    Teardown: the server's process group, then every run still active in that home
    (engine.run.launcher.stop, then SIGKILL of any worker group left)."""
    yield from _served_app(tmp_path)


def _served_app(tmp_path):
    """Start a server in tmp_path, yield it, then stop it and every run it left active."""
    srv = StreamlitServer(home=tmp_path / "lab_home", log_dir=tmp_path / "logs")
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()
        stop_all_runs(srv.home)


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(30_000)
    tab = context.new_page()
    tab.js_errors = []  # uncaught errors in the page: a broken frontend, not a slow one
    tab.on("pageerror", lambda exc: tab.js_errors.append(str(exc)))
    try:
        yield tab
    finally:
        context.close()


@pytest.fixture
def store(server):
    from engine.store import Store

    return Store(server.home)


# ---------------------------------------------------------------------------------------
# steps shared by the tests


def assert_page_healthy(page, where: str) -> None:
    assert not exceptions(page), f"{where}: Streamlit exception on the page: {exceptions(page)}"
    # Streamlit's own modals: "Page not found", connection errors.
    dialogs = page.locator('[role="dialog"]').all_inner_texts()
    assert not dialogs, f"{where}: dialog shown: {dialogs}"
    assert not page.js_errors, f"{where}: uncaught JavaScript errors: {page.js_errors}"


def nav_paths(page) -> list[str]:
    """URL paths of the sidebar's navigation links ('' is the default page)."""
    hrefs = page.locator('[data-testid="stSidebarNavLink"]').evaluate_all(
        "links => links.map(a => a.getAttribute('href'))")
    return [urlparse(href).path.strip("/") for href in hrefs]


def launch_from_form(page, server, *, precision: str, batch_size: int, steps: int,
                     screenshot_to=None) -> str:
    """Fill the Launch form through its real widgets, click Launch, land on Live."""
    goto(page, f"{server.url}/", TITLES[""])
    choose(page, "device", lambda text: text.startswith("cpu:"))
    choose(page, "model", "gpt")
    choose(page, "size", "tiny")
    choose(page, "precision", lambda text: f" {precision}:" in f" {text}")
    set_number(page, "batch_size", batch_size)
    set_number(page, "steps", steps)
    assert_page_healthy(page, "Launch form")
    if screenshot_to is not None:
        screenshot(page, "launch.png", screenshot_to)
    page.get_by_role("button", name="Launch run", exact=True).click()
    page.wait_for_url(LIVE_URL, timeout=30_000)
    page.get_by_role("heading", name=TITLES["live"], exact=True).wait_for()
    return parse_qs(urlparse(page.url).query)["run"][0]


def wait_points(page, more_than: int, timeout_s: float) -> int:
    """Wait until the Loss chart plots more than `more_than` points; return the count.

    The fragment redraws the charts every second, so a read may land mid-redraw (-1)."""
    return wait_for(lambda: (n := chart_points(page, "Loss")) > more_than and n, timeout_s,
                    interval_s=0.3, message=lambda: f"the Loss chart to pass {more_than} "
                    f"points (charts: {chart_titles(page)}; page: {main_text(page)[:400]!r})")


def status_of(store, run_id: str) -> str:
    return store.get_run(run_id).status


# ---------------------------------------------------------------------------------------
# tests


@pytest.mark.timeout(120)
def test_every_page_in_the_nav_loads_without_an_exception(server, page):
    goto(page, f"{server.url}/", TITLES[""])
    paths = nav_paths(page)
    assert set(TITLES) <= set(paths), f"sidebar nav lacks a core page: {paths}"
    for path in paths:
        url = f"{server.url}/{path}"
        goto(page, url, TITLES.get(path))
        where = f"/{path}"
        assert_page_healthy(page, where)
        assert page.locator("h1").first.inner_text().strip(), f"{where}: no title"
        if path in TITLES:
            # Nothing about the app itself is in error on a fresh, empty data directory.
            assert not error_alerts(page), f"{where}: error shown: {error_alerts(page)}"
        if path in ("live", "runs"):
            assert "No runs yet" in main_text(page), f"{where}: empty store not explained"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_launch_from_the_form_watch_the_loss_chart_grow_then_stop(server, page, store,
                                                                   tmp_path):
    # Enough steps that the run is still training when Stop is clicked, also where bf16
    # runs natively (avx512_bf16: ~20 ms a step) rather than emulated.
    steps = 3000
    run_id = launch_from_form(page, server, precision="bf16-amp", batch_size=8, steps=steps,
                              screenshot_to=tmp_path)
    (run,) = store.list_runs()
    assert run.id == run_id
    cfg = run.config
    assert (cfg.model, cfg.size, cfg.precision, cfg.batch_size, cfg.steps, cfg.device) == (
        "gpt", "tiny", "bf16-amp", 8, steps, "cpu"), cfg

    # The fragment's 1 s timer redraws the chart as the worker logs steps.
    first = wait_points(page, 0, timeout_s=90)
    later = wait_points(page, first, timeout_s=30)
    assert later > first
    assert status_of(store, run_id) == "running", "the run ended before it could be watched"
    # plotly draws each chart on its own after the script run sent them all: on a busy
    # machine the loss chart can be up a moment before the other two
    # the memory chart's unit is the Peak memory tile's (MiB below 1 GiB)
    wait_for(lambda: {"Loss", "Throughput (tokens/s)"} <= set(chart_titles(page)) and any(
                 t in ("Memory (MiB)", "Memory (GiB)") for t in chart_titles(page)),
             20, message=lambda: f"the three charts (drawn: {chart_titles(page)})")
    assert_page_healthy(page, "Live while training")

    wait_points(page, 7, timeout_s=30)  # a few seconds of curve for the screenshot
    wait_app_idle(page, timeout_s=5, required=False)  # between two timer ticks, if we can
    screenshot(page, "live.png", tmp_path)

    page.get_by_role("button", name="Stop run").click()
    clicked = time.monotonic()
    page.get_by_text("stopped by request").first.wait_for(timeout=10_000)
    wait_for(lambda: status_of(store, run_id) == "stopped", 10 - (time.monotonic() - clicked),
             message="the store to say stopped")
    assert time.monotonic() - clicked < 10
    assert not worker_processes(run_id), "a worker outlived the Stop button"
    # The ended run: no Stop button, no refresh timer, the curve kept.
    page.get_by_role("button", name="Stop run").wait_for(state="detached", timeout=10_000)
    # The ended run's page draws its charts anew: one out of view is drawn when scrolled
    # to or a second later (pages/plot_view.py).
    wait_for(lambda: chart_points(page, "Loss") >= later, 10,
             message=lambda: f"the loss curve kept ({chart_points(page, 'Loss')} points)")
    assert_page_healthy(page, "Live after stop")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_server_restart_mid_run_keeps_the_run_and_launches_nothing_twice(server, page, store):
    run_id = launch_from_form(page, server, precision="fp32", batch_size=8, steps=20_000)
    wait_points(page, 0, timeout_s=90)
    run = store.get_run(run_id)
    assert run.status == "running" and run.pid and run.train_pid
    groups = worker_groups(run_id)
    assert groups == {run.pid}, f"expected one worker group led by the supervisor: {groups}"

    port = server.port
    server.stop()  # the server's process group only: the worker has its own session
    from engine.proc import is_alive

    assert is_alive(run.pid, run.pid_create_time), "the supervisor died with the server"
    assert is_alive(run.train_pid, None), "the trainer died with the server"
    assert status_of(store, run_id) == "running"
    at_stop = store.get_run(run_id).steps_completed
    wait_for(lambda: store.get_run(run_id).steps_completed > at_stop, 30,
             message="training to go on with the server down")

    server.start()
    assert server.port == port
    goto(page, f"{server.url}/live?run={run_id}", TITLES["live"], idle=False)
    assert run_id in page.locator(".st-key-live_select").get_by_role("combobox").input_value()
    first = wait_points(page, 0, timeout_s=60)
    wait_points(page, first, timeout_s=30)
    assert_page_healthy(page, "Live after a server restart")

    # The same run, the same worker: nothing relaunched.
    runs = store.list_runs()
    assert [r.id for r in runs] == [run_id]
    after = store.get_run(run_id)
    assert after.status == "running"
    assert (after.pid, after.train_pid) == (run.pid, run.train_pid)
    assert worker_groups(run_id) == groups
    roles = sorted("--train" in p.cmdline() for p in worker_processes(run_id))
    assert roles == [False, True], "expected one supervisor and one trainer"


@pytest.mark.timeout(120)
def test_runs_page_lists_the_runs_and_opens_one_in_live(server, page, store):
    from engine.config import RunConfig

    finished = store.create_run(RunConfig(model="gpt", size="tiny", precision="fp32"), "cpu",
                                "test cpu")
    store.set_status(finished, "running")
    store.write_metrics(finished, [
        {"step": s, "loss": 5.0 - 0.1 * s, "tokens_per_s": 500.0 + s, "step_time_ms": 100.0,
         "rss_bytes": 2**28, "mem_peak_bytes": 2**28, "phase": "steady" if s > 3 else "warmup"}
        for s in range(1, 21)])
    store.merge_summary(finished, {"tokens_per_s": 512.25, "final_loss": 3.0,
                                   "peak_mem_bytes": 2**28})
    store.set_status(finished, "finished")
    failed = store.create_run(RunConfig(model="mlp", precision="bf16-amp"), "cpu", "test cpu")
    store.set_status(failed, "failed", "worker exited with signal 9 (SIGKILL) at step 3")

    goto(page, f"{server.url}/runs", TITLES["runs"])
    assert_page_healthy(page, "/runs")
    assert "2 of 2 runs" in main_text(page)
    rows = wait_for(lambda: grid_cells(page), 20, message="the runs table's rows")
    columns = grid_columns(page)
    # the columns that fit 1280 px: the label says model, precision and batch size
    assert columns[:3] == ["label", "status", "steps"], columns
    label = {run_id: store.get_run(run_id).config.label for run_id in (finished, failed)}
    by_label = {row[0]: dict(zip(columns, row)) for row in rows}
    assert set(by_label) == set(label.values())
    assert by_label[label[finished]]["status"].endswith("finished")
    assert label[finished].startswith("gpt-tiny")
    assert by_label[label[finished]]["steps"] == "20/60"
    assert by_label[label[failed]]["status"].endswith("failed")
    assert " bf16-amp " in label[failed]

    # Select the failed run's row (glide draws on a canvas: click its row marker).
    row_index = [row[0] for row in rows].index(label[failed])
    canvas = page.locator('[data-testid="stDataFrame"] canvas').first.bounding_box()
    header_px = row_px = 35  # st.dataframe's default header and row heights
    page.mouse.click(canvas["x"] + 15, canvas["y"] + header_px + row_px * row_index + row_px / 2)
    page.get_by_text(f"Run {failed}").first.wait_for()
    button = page.get_by_role("button", name="Open in Live", exact=True)
    button.click()
    page.wait_for_url(re.compile(rf"/live\?run={failed}$"))
    page.get_by_text("signal 9").first.wait_for()
    assert_page_healthy(page, "Live of a failed run")

    # The finished run's Live page draws its stored curve (no timer: the run has ended).
    goto(page, f"{server.url}/live?run={finished}", TITLES["live"])
    wait_for(lambda: chart_points(page, "Loss") == 20, 20, message="the stored 20 points")
    assert_page_healthy(page, "Live of a finished run")


@pytest.mark.timeout(180)
def test_runs_page_relaunch_fills_the_launch_form_and_archive_hides_the_run(server, page, store):
    from engine.config import RunConfig

    source = store.create_run(RunConfig(model="mlp", precision="bf16-amp", batch_size=48,
                                        steps=77, name="to re-launch"), "cpu", "test cpu")
    store.set_status(source, "finished")
    goto(page, f"{server.url}/runs", TITLES["runs"])
    wait_for(lambda: grid_cells(page), 20, message="the runs table's rows")
    canvas = page.locator('[data-testid="stDataFrame"] canvas').first.bounding_box()
    page.mouse.click(canvas["x"] + 15, canvas["y"] + 35 + 35 / 2)  # the only row's marker
    page.get_by_role("button", name="Re-launch with this config", exact=True).click()
    page.get_by_text(f"Filled in from run {source}").first.wait_for()
    wait_app_idle(page)
    wait_for(lambda: widget(page, "batch_size").locator("input").input_value() == "48", 10,
             message="the batch size filled in from the run")
    assert widget(page, "steps").locator("input").input_value() == "77"
    assert widget(page, "name").locator("input").input_value() == "to re-launch"
    assert len(store.list_runs()) == 1  # nothing launched yet
    assert_page_healthy(page, "Launch prefilled")
    # the address names the run: the filled form can be shared, and a fresh page fills it
    shared = page.url
    assert parse_qs(urlparse(shared).query).get("relaunch") == [source], shared
    fresh = page.context.new_page()
    try:
        fresh.goto(shared)
        fresh.get_by_text(f"Filled in from run {source}").first.wait_for(timeout=30_000)
        wait_for(lambda: widget(fresh, "batch_size").locator("input").input_value() == "48",
                 20, message="the batch size filled in from the shared link")
    finally:
        fresh.close()

    goto(page, f"{server.url}/runs", TITLES["runs"])
    wait_for(lambda: grid_cells(page), 20, message="the runs table's rows")
    canvas = page.locator('[data-testid="stDataFrame"] canvas').first.bounding_box()
    page.mouse.click(canvas["x"] + 15, canvas["y"] + 35 + 35 / 2)
    page.get_by_role("button", name="Open in Live", exact=True).click()
    page.wait_for_url(re.compile(r"/live\?run="), timeout=30_000)
    assert parse_qs(urlparse(page.url).query).get("run") == [source], page.url

    goto(page, f"{server.url}/runs", TITLES["runs"])
    wait_for(lambda: grid_cells(page), 20, message="the runs table's rows")
    canvas = page.locator('[data-testid="stDataFrame"] canvas').first.bounding_box()
    page.mouse.click(canvas["x"] + 15, canvas["y"] + 35 + 35 / 2)
    page.get_by_role("button", name="Archive", exact=True).click()
    page.get_by_text("1 archived, hidden").first.wait_for()
    assert store.get_run(source).archived
    assert_page_healthy(page, "Runs after archive")


@pytest.mark.timeout(120)
def test_first_request_to_a_page_url_gets_the_app_shell(server, page):
    """A fresh server whose very first request is /runs must still route through app.py:
    Streamlit's legacy `pages/` mode would otherwise run pages/runs.py alone (no app
    navigation, no device card, a nav listing every file in pages/)."""
    goto(page, f"{server.url}/runs", title="Runs")
    assert_page_healthy(page, "/runs as first request")
    assert urlparse(page.url).path.strip("/") == "runs"
    assert set(nav_paths(page)) >= {"", "live", "runs"}
    assert not {"ui", "charts", "app"} & set(nav_paths(page))
    sidebar = page.locator('[data-testid="stSidebar"]').inner_text()
    assert "Devices" in sidebar


def _drawn_line_vertices(page, title: str) -> int:
    """Vertices of the first line plotly actually drew in the chart titled `title`: the
    SVG path proves the browser decoded the data (numpy arrays travel as typed arrays)."""
    return page.evaluate("""(title) => {
      for (const el of document.querySelectorAll('.js-plotly-plot')) {
        const text = el.querySelector('.gtitle');
        if (!text || !text.textContent.startsWith(title)) continue;
        const line = el.querySelector('.scatterlayer .trace path.js-line');
        const d = line ? line.getAttribute('d') || '' : '';
        return (d.match(/[ML]/g) || []).length;
      }
      return -1;
    }""", title)


@pytest.mark.timeout(120)
def test_compare_page_draws_every_runs_curve(server, page, store):
    from engine.config import RunConfig
    from engine.run.finalize import finalize_run_data

    for precision, speed in (("fp32", 1.0), ("bf16-amp", 1.8)):
        run_id = store.create_run(RunConfig(model="gpt", size="tiny", precision=precision),
                                  "cpu", "test cpu")
        store.set_status(run_id, "running")
        store.write_metrics(
            run_id,
            [
                # zig-zags: plotly merges collinear points of a line, these it cannot
                {
                    "step": s,
                    "loss": 5.0 * 0.9**s + 0.05 * (s % 2),
                    "tokens_per_s": speed * (500.0 + 30.0 * (s % 2)),
                    "step_time_ms": 100.0 / speed,
                    "rss_bytes": 2**28,
                    "mem_peak_bytes": 2**28,
                    "wall_time_s": 0.1 * s / speed,
                    "phase": "steady" if s > 3 else "warmup",
                }
                for s in range(1, 21)
            ],
        )
        finalize_run_data(store, run_id)
        store.set_status(run_id, "finished")

    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    goto(page, f"{server.url}/compare", "Compare runs")
    wait_for(lambda: chart_points(page, "Loss") == 20, 30, message="20 loss points per run")
    # Line charts draw with the basic plotly.js bundle (pages/plot_view.py), never
    # Streamlit's full one.
    assert any(url.endswith("/app/static/plotly/plotly-basic-4.1.1.min.js") for url in requested)
    assert not [url for url in requested if "PlotlyChart" in url], requested
    # loaded as a script (compiled code kept between tabs), and no global Plotly left
    assert page.evaluate("window.__precisionLabPlotlyLoadedBy") == {
        "/app/static/plotly/plotly-basic-4.1.1.min.js": "script"}
    assert page.evaluate("typeof window.Plotly") == "undefined"
    # Each chart is drawn in turn: a loaded machine can show Loss before Throughput.
    for title in ("Loss", "Throughput"):
        wait_for(lambda: _drawn_line_vertices(page, title) == 20, 30,
                 message=f"the {title} chart's line drawn with 20 vertices")
    assert "1.80x" in main_text(page) or "1.8x" in main_text(page), main_text(page)[:600]
    assert_page_healthy(page, "/compare")


@pytest.mark.timeout(120)
def test_sweep_heatmap_draws_with_the_cartesian_bundle_beside_the_basic_one(server, page,
                                                                              store):
    """Both plotly.js bundles in one tab: a line chart (basic), then the Sweep page's
    heatmap (cartesian) reached from the sidebar; each loads once as a script, and neither
    leaves a global Plotly behind for the other to find."""
    from tests.test_sweep import _claims_sweep

    _claims_sweep(store)  # hand-written summaries: mlp x 4 precisions x 2 batch sizes
    goto(page, f"{server.url}/compare", "Compare runs")
    page.get_by_role("link", name="Sweep", exact=True).click()
    page.get_by_role("heading", name="Sweeps", exact=True).first.wait_for()
    wait_for(lambda: page.locator(".js-plotly-plot .heatmaplayer image").count() >= 1, 30,
             message="the sweep heatmap drawn")
    wait_app_idle(page, 30)
    loaded_by = page.evaluate("window.__precisionLabPlotlyLoadedBy")
    assert loaded_by == {"/app/static/plotly/plotly-basic-4.1.1.min.js": "script",
                         "/app/static/plotly/plotly-cartesian-4.1.1.min.js": "script"}, loaded_by
    assert page.evaluate("typeof window.Plotly") == "undefined"
    assert "throughput" in " ".join(chart_titles(page)).lower(), chart_titles(page)
    assert_page_healthy(page, "/sweep")


def test_launch_refuses_an_out_of_range_batch_size_on_screen(server, page, store):
    """Batch size 0 is named with the allowed range and Launch is disabled: before, the
    browser kept the last valid value (16) and Launch started a run with it."""
    goto(page, f"{server.url}/", TITLES[""])
    set_number(page, "batch_size", 0)
    message = "Batch size: 0 is not a whole number from 1 to 65,536"
    page.get_by_text(message, exact=True).first.wait_for(state="visible", timeout=10_000)
    launch = page.get_by_role("button", name="Launch run", exact=True)
    assert launch.is_disabled(), "Launch run is still enabled with batch size 0"
    launch.click(force=True)  # a click on the disabled button must start nothing
    wait_app_idle(page)
    assert store.list_runs() == [], "a run was created from an out-of-range batch size"
    assert "/live" not in page.url
    assert_page_healthy(page, "Launch with batch size 0")


@pytest.fixture
def workload_server(browser, tmp_path, monkeypatch):
    """The app with PRECISION_LAB_WORKLOADS pointing at the shipped example workloads."""
    monkeypatch.setenv("PRECISION_LAB_WORKLOADS", str(REPO_ROOT / "examples" / "workloads"))
    yield from _served_app(tmp_path)


def _launch_example_workload(page, server, precision: str) -> str:
    goto(page, f"{server.url}/", TITLES[""])
    choose(page, "device", lambda text: text.startswith("cpu:"))
    choose(page, "model", lambda text: text.startswith("custom: your own workload"))
    chosen = widget(page, "workload").get_by_role("combobox").input_value()
    assert chosen.startswith("tiny_transformer.py"), chosen
    choose(page, "precision", lambda text: f" {precision}:" in f" {text}")
    set_number(page, "steps", 24)
    page.get_by_role("button", name="Launch run", exact=True).click()
    page.wait_for_url(LIVE_URL, timeout=30_000)
    return parse_qs(urlparse(page.url).query)["run"][0]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_your_workload_bound_by_why_b_is_faster_and_a_speedup_check_in_the_browser(
        workload_server, browser, tmp_path):
    """The example workload launched from the app (listed from PRECISION_LAB_WORKLOADS),
    its bound-by verdict on Live, the fp32 vs bf16-amp explanation on Compare, and a
    speedup check launched from Launch drawn as a forest plot on Live."""
    from engine.store import Store

    server, store = workload_server, Store(workload_server.home)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(30_000)
    page = context.new_page()
    page.js_errors = []
    page.on("pageerror", lambda exc: page.js_errors.append(str(exc)))
    try:
        ids = [_launch_example_workload(page, server, p) for p in ("fp32", "bf16-amp")]
        for run_id in ids:
            wait_for(lambda: status_of(store, run_id) in ("finished", "failed", "oom"), 180,
                     message=f"run {run_id} to end")
            assert status_of(store, run_id) == "finished", store.get_run(run_id).reason
        assert store.get_run(ids[0]).config.model == "custom"

        goto(page, f"{server.url}/live?run={ids[1]}", TITLES["live"])
        page.get_by_text("Bound by:").first.wait_for(timeout=30_000)
        assert_page_healthy(page, "Live of a custom workload")

        goto(page, f"{server.url}/compare?runs={ids[0]},{ids[1]}&baseline={ids[0]}",
             "Compare runs")
        page.get_by_role("heading", name="Why one run is faster than another").wait_for()
        # The sentence ends "-> step 1.3x slower" (Streamlit draws the arrow as one glyph).
        wait_for(lambda: re.search(r" vs .*(->|→) step [\d.]+x", main_text(page)), 60,
                 message=lambda: f"the part-by-part sentence (page: {main_text(page)[:3000]!r})")
        assert_page_healthy(page, "Compare with the B-vs-A explanation")

        goto(page, f"{server.url}/", TITLES[""])
        choose(page, "device", lambda text: text.startswith("cpu:"))
        choose(page, "model", "mlp")
        set_number(page, "speedup_budget_s", 20)
        page.get_by_role("button", name="Run speedup check", exact=True).click()
        page.wait_for_url(LIVE_URL, timeout=30_000)
        wait_for(lambda: any(t.startswith("Speedup vs fp32 (95 % interval)")
                             for t in chart_titles(page)), 150,
                 message=lambda: f"the forest plot (charts: {chart_titles(page)})")
        assert_page_healthy(page, "Live of a speedup check")
    finally:
        context.close()


@pytest.mark.timeout(180)
def test_kernels_page_upload_two_traces_and_a_broken_one(server, page, tmp_path):
    """Upload a real A100 trace as A: the verdict and accounting; a broken file as B: one
    error naming B (not A, and the name once); then a real H100 trace as B: the B-vs-A
    section with its two-GPU caveat."""
    traces = Path(__file__).parent / "data" / "traces"
    broken = tmp_path / "notes.json"
    broken.write_text("these are not profiler events")
    goto(page, f"{server.url}/kernels", "Kernels")
    page.get_by_text("Upload a trace file", exact=True).click()
    uploaders = page.locator('[data-testid="stFileUploaderDropzoneInput"]')
    uploaders.first.wait_for(state="attached")
    uploaders.nth(0).set_input_files(str(traces / "a100_conv_nccl_hta.json.gz"))
    wait_for(lambda: "but the GPU was idle 76 % of the step" in main_text(page), 60,
             message=lambda: f"the A100 verdict (page: {main_text(page)[:2000]!r})")
    uploaders.nth(1).set_input_files(str(broken))
    wait_for(lambda: error_alerts(page), 60, message="an error for the broken B")
    [error] = error_alerts(page)
    assert "notes.json" in error and error.count("notes.json") == 1, error
    assert "a100_conv_nccl_hta" not in error, error
    assert "but the GPU was idle 76 % of the step" in main_text(page)  # A still shown
    uploaders.nth(1).set_input_files(str(traces / "h100_bert_small_tracelens.json.gz"))
    # the section streams in: wait for its caveat, drawn after the heading
    wait_for(lambda: "the parts compare two different GPUs" in main_text(page), 60,
             message=lambda: f"the B-vs-A section (page: {main_text(page)[-2000:]!r})")
    assert "Why B (bf16) against A (tf32)" in main_text(page)
    wait_for(lambda: "share of A's step" in grid_columns(page), 30,
             message=lambda: f"the parts table (columns: {grid_columns(page)})")
    assert not error_alerts(page)
    assert_page_healthy(page, "Kernels with two uploaded traces")


@pytest.mark.timeout(180)
def test_kernels_page_reads_one_jobs_rank_traces(server, page, tmp_path):
    """Four rank traces (the real 2-rank set, rank 2 made 30 % slower) uploaded together:
    the per-rank table with four rows and the sentence naming rank 2; then one zip of them
    reads the same."""
    import zipfile

    from test_trace_scale import make_four_ranks

    folder = make_four_ranks(tmp_path / "job")
    files = sorted(str(p) for p in folder.iterdir())
    goto(page, f"{server.url}/kernels", "Kernels")
    page.get_by_text("Upload one job's rank traces", exact=True).click()
    uploader = page.locator('[data-testid="stFileUploaderDropzoneInput"]')
    uploader.first.wait_for(state="attached")
    uploader.first.set_input_files(files)
    wait_for(lambda: "slowest rank 2" in main_text(page), 90,
             message=lambda: f"the rank sentence (page: {main_text(page)[:2000]!r})")
    wait_for(lambda: "idle over GPU span" in grid_columns(page), 30,
             message=lambda: f"the rank table (columns: {grid_columns(page)})")
    assert "4 rank traces" in main_text(page) and not error_alerts(page)
    assert_page_healthy(page, "Kernels with a trace set")

    archive = tmp_path / "job.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for path in files:
            handle.write(path, Path(path).name)
    goto(page, f"{server.url}/kernels", "Kernels")
    page.get_by_text("Upload one job's rank traces", exact=True).click()
    uploader = page.locator('[data-testid="stFileUploaderDropzoneInput"]')
    uploader.first.wait_for(state="attached")
    uploader.first.set_input_files(str(archive))
    wait_for(lambda: "slowest rank 2" in main_text(page), 90,
             message=lambda: f"the rank sentence from a zip (page: {main_text(page)[:2000]!r})")
    assert not error_alerts(page)


_FOREST_LABELS_JS = """() => Array.from(document.querySelectorAll(
    '.js-plotly-plot .textpoint text')).map(t => t.textContent)"""
_CLAIM = re.compile(r"\d(\.\d+)?x (faster|slower) than")


@pytest.mark.timeout(420)
def test_an_aa_check_from_the_form_under_load_is_inconclusive_on_every_surface(
        server, page, store, tmp_path):
    """The A/A button launches the baseline against itself; run under a CPU hog, the
    check's forest plot, table and text in the browser, Compare, the HTML report and the
    CLI's JSON all say "inconclusive" and none states a difference."""
    from bench._hog import cpu_hog
    from engine.analysis.speedup import mode_row
    from engine.cli.speedup import check_result, format_result
    from engine.report.html import build_html

    goto(page, f"{server.url}/", TITLES[""])
    choose(page, "device", lambda text: text.startswith("cpu:"))
    choose(page, "model", "mlp")
    # The hog slows set-up too (a 2-core CI machine took 8 s before the first step), so
    # the budget leaves room for both modes' rounds after a slow start.
    set_number(page, "speedup_budget_s", 60)
    with cpu_hog(processes=2):
        page.get_by_role("button", name="A/A check (fp32 vs itself)", exact=True).click()
        page.wait_for_url(LIVE_URL, timeout=30_000)
        run_id = parse_qs(urlparse(page.url).query)["run"][0]
        wait_for(lambda: status_of(store, run_id) in ("finished", "failed", "stopped"), 240,
                 message=f"check {run_id} to end")
    check = store.get_run(run_id)
    assert check.status == "finished", check.reason
    assert check.config.speedup_mode_list == ["fp32", "fp32"]
    assert check.summary["contention"]["busy"] is True, check.summary["contention"]

    goto(page, f"{server.url}/live?run={run_id}", TITLES["live"])
    wait_for(lambda: page.evaluate(_FOREST_LABELS_JS), 60, message="the forest plot's labels")
    labels = page.evaluate(_FOREST_LABELS_JS)
    assert labels and all(label.endswith(" inconclusive") for label in labels), labels
    assert any("machine busy: inconclusive" in t for t in chart_titles(page)), chart_titles(page)
    wait_for(lambda: len(grid_cells(page)) >= 2, 30, message="the per-mode table")
    columns = grid_columns(page)
    twin_row = next(row for row in grid_cells(page) if "fp32 (2)" in row)
    verdict_cell = twin_row[columns.index("verdict")] if "verdict" in columns else twin_row[-1]
    assert verdict_cell.startswith("inconclusive: the machine was busy"), verdict_cell
    text = main_text(page)
    assert "throughput figures are unreliable" in text
    assert not _CLAIM.search(text), text[:3000]
    assert_page_healthy(page, "Live of a busy A/A check")

    goto(page, f"{server.url}/compare?runs={run_id}", "Compare runs")
    wait_for(lambda: page.evaluate(_FOREST_LABELS_JS), 60, message="Compare's forest plot")
    assert all(label.endswith(" inconclusive") for label in page.evaluate(_FOREST_LABELS_JS))
    assert not _CLAIM.search(main_text(page))

    report = build_html(store, [run_id])
    assert "inconclusive: the machine was busy" in report and not _CLAIM.search(report)
    result = check_result(run_id, store)
    twin = mode_row(result, "fp32 (2)")
    assert twin["verdict"] == "inconclusive" and twin["significant"] is False
    assert twin["verdict_reason"] == "the machine was busy during the check"
    assert not _CLAIM.search(format_result(result))
