"""Click Launch -> first point visible on the Live page, in a real browser.

    python -m bench.first_point_browser [--servers 1] [--launches 3] [--quick] [--json]

bench/first_point.py times launch -> first metric row in the store; this one times what
a person sees: a `streamlit run app.py` server on a private data directory, Chromium
(Playwright, /usr/bin/chromium, never a downloaded browser) on the Launch page with its
defaults (gpt-tiny on this machine's default device), a click on "Launch run", then the
Live page's Loss chart polled in the page (every 20 ms) until plotly has drawn a point
of the trace (a marker or a line vertex in the SVG trace layer). Beside it, the same
click -> the first row in the store (a reader thread polling every 10 ms), so the
difference is the page's own delay (navigation, the fragment's timer, drawing).

Each server (`--servers`, each on a data directory of its own) takes `--launches`
launches: the first is the server's first launch (its first page, a cold tab), the rest
are warm. A server's first launch varies most (the tab loads plotly, the server imports
the Live page), so `--servers 20` measures how often it misses its goal. Each launch
starts with the standby trainer listening (the app starts one; every run's supervisor
leaves a new one), as after a person has read the form; the run is stopped as soon as
its point is seen. Goals (issue-level, as bench.pages_browser): < 3 s on a server's first
launch, < 1.5 s warm, on an idle machine. Without Chromium or Playwright it says so and
exits 3.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench._common import REPO_ROOT, emit_json, machine_info, print_table, spread, subprocess_env

FIRST_LAUNCH_GOAL_S = 3.0  # a server's first launch
WARM_GOAL_S = 1.5  # every later launch
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
STORE_POLL_S = 0.010
PAGE_POLL_MS = 20
POINT_TIMEOUT_S = 90.0
SERVER_START_TIMEOUT_S = 90.0
STANDBY_READY_TIMEOUT_S = 90.0
EXIT_NO_BROWSER = 3

# True once the Loss chart's first trace shows a point: a marker, or a line with a vertex.
_POINT_DRAWN_JS = """() => {
  for (const el of document.querySelectorAll('.js-plotly-plot')) {
    const title = el.querySelector('.gtitle');
    if (!title || title.textContent.trim() !== 'Loss') continue;
    const trace = el.querySelector('.scatterlayer .trace');
    if (!trace) return false;
    if (trace.querySelector('.points path')) return true;
    const line = trace.querySelector('path.js-line');
    return !!line && /\\d/.test(line.getAttribute('d') || '');
  }
  return false;
}"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.first_point_browser",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=1,
                        help="fresh servers, each on its own data directory (default 1)")
    parser.add_argument("--launches", type=int, default=3,
                        help="launches per server, the first of them cold (default 3)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: one server, two launches (first and warm)")
    parser.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    args = parser.parse_args(argv)
    if args.quick:
        args.servers, args.launches = 1, 2
    if args.servers < 1 or args.launches < 1:
        parser.error("--servers and --launches must be at least 1")
    return args


def browser_missing() -> str | None:
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)):
        return f"{CHROMIUM} not found: install Debian's `chromium` package"
    try:
        import playwright.sync_api  # noqa: F401 - only to say it is missing
    except ImportError:
        return "Python package `playwright` not installed (the system Chromium is used)"
    return None


# ---------------------------------------------------------------------------------------
# the server


class Server:
    """`streamlit run app.py` in a session of its own: stop() ends its group only (run
    workers and the standby have their own sessions and are stopped through the engine)."""

    def __init__(self, home: Path, log_path: Path, script: str = "app.py"):
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        env = subprocess_env(home, PRECISION_LAB_STANDBY="1", PYTHONUNBUFFERED="1",
                             STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streamlit", "run", script, "--server.port",
                 str(self.port), "--server.headless", "true"],
                cwd=str(REPO_ROOT), env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        self.log_path = log_path

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"streamlit exited {self.proc.returncode}: "
                                   f"{self.log_path.read_text(errors='replace')[-1500:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=2) as reply:
                    if reply.read().strip() == b"ok":
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"streamlit not healthy after {SERVER_START_TIMEOUT_S:.0f} s")

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc.wait(timeout=5)


# ---------------------------------------------------------------------------------------
# one launch


def wait_standby(home: Path) -> None:
    from engine.run import standby

    deadline = time.monotonic() + STANDBY_READY_TIMEOUT_S
    while standby.ping(home) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no standby listening after {STANDBY_READY_TIMEOUT_S:.0f} s")
        time.sleep(0.1)


def watch_store(db_path: Path, after_seq: int, seen: dict[str, float],
                stop: threading.Event) -> None:
    """Note when a run newer than `after_seq` first has a metric row (a reader thread)."""
    while not stop.is_set():
        try:
            conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5.0)
            try:
                row = conn.execute("SELECT r.id FROM runs r WHERE r.seq > ? AND EXISTS (SELECT"
                                   " 1 FROM metrics m WHERE m.run_id = r.id)",
                                   (after_seq,)).fetchone()
            finally:
                conn.close()
        except sqlite3.OperationalError:  # locked for a moment by a writer: poll again
            row = None
        if row:
            seen["first_row"], seen["run_id"] = time.time(), row[0]
            return
        time.sleep(STORE_POLL_S)


def one_launch(page, server: Server, store, via_sidebar: bool = False) -> dict[str, Any]:
    """Launch page -> click -> Live -> first point drawn; seconds from the click.

    The Launch page is opened by its address (a new page load), or with `via_sidebar`, from
    the Live page the previous launch ended on, by the sidebar's link, as a person goes on
    from one run to the next: the tab keeps the JavaScript it has loaded (plotly among it)."""
    if via_sidebar and "/live" not in page.url:
        raise RuntimeError(f"via_sidebar: the tab is on {page.url}, not on a Live page")
    if via_sidebar:
        page.get_by_role("link", name="Launch", exact=True).first.click()
        page.wait_for_url(lambda url: "/live" not in url, timeout=60_000)
    else:
        page.goto(f"{server.url}/")
    button = page.get_by_role("button", name="Launch run", exact=True)
    button.wait_for(timeout=60_000)
    wait_standby(store.home)  # the app starts one with its first page
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]',
                           timeout=60_000)
    conn = sqlite3.connect(f"file:{store.db_path}?mode=ro", uri=True, timeout=5.0)
    try:
        after_seq = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM runs").fetchone()[0]
    finally:
        conn.close()
    seen: dict[str, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_store, args=(store.db_path, after_seq, seen, stop),
                               daemon=True)
    watcher.start()
    clicked = time.time()
    try:
        button.click()
        page.wait_for_url("**/live?run=*", timeout=POINT_TIMEOUT_S * 1000)
        on_live = time.time()
        page.wait_for_function(_POINT_DRAWN_JS, polling=PAGE_POLL_MS,
                               timeout=POINT_TIMEOUT_S * 1000)
        visible = time.time()
        watcher.join(timeout=POINT_TIMEOUT_S)
    finally:
        stop.set()
        watcher.join(timeout=5)
    result = {"run_id": seen.get("run_id"), "via": "sidebar" if via_sidebar else "address",
              "click_to_live_page_s": on_live - clicked,
              "click_to_store_s": seen.get("first_row", float("nan")) - clicked,
              "click_to_visible_s": visible - clicked}
    result["store_to_visible_s"] = result["click_to_visible_s"] - result["click_to_store_s"]
    return result


def stop_runs(store) -> None:
    """Stop every run still active in the private store: none outlives the benchmark."""
    from engine.run.launcher import stop
    from engine.schema import ACTIVE_STATUSES

    for run in store.list_runs(statuses=ACTIVE_STATUSES):
        try:
            stop(run.id, store, grace_s=1.0)
        except Exception:  # noqa: BLE001 - best effort; keep stopping the others
            pass


# ---------------------------------------------------------------------------------------


def measure(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    from playwright.sync_api import sync_playwright

    launches: list[dict[str, Any]] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for number in range(args.servers):
                launches += measure_server(browser, tmp / f"server{number}", args.launches)
        finally:
            browser.close()
    return launches


def measure_server(browser, tmp: Path, launch_count: int) -> list[dict[str, Any]]:
    """A fresh server and a fresh tab: its first launch, then the warm ones."""
    from engine.run import standby
    from engine.store import Store

    home = tmp / "home"
    store = Store(home)
    server = Server(home, tmp / "streamlit.log")
    launches: list[dict[str, Any]] = []
    page = None
    try:
        server.wait_healthy()
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for number in range(launch_count):
            launches.append(one_launch(page, server, store) | {"first_of_server": number == 0})
            stop_runs(store)
    except Exception:
        print_logs(tmp, home)  # the data directory goes with the benchmark: say why here
        raise
    finally:
        if page is not None:
            page.close()
        server.stop()
        stop_runs(store)
        end_standbys(home, standby)
    return launches


def print_logs(tmp: Path, home: Path, tail_chars: int = 3000) -> None:
    """The ends of the server's, the standby's and each run's logs, to stderr."""
    from engine.schema import STANDBY_LOG, WORKER_LOG

    logs = [tmp / "streamlit.log", home / STANDBY_LOG, *sorted(home.glob(f"runs/*/{WORKER_LOG}"))]
    for path in logs:
        if path.is_file():
            text = path.read_text(errors="replace")[-tail_chars:]
            print(f"--- {path.relative_to(tmp)} (last {tail_chars} characters)\n{text}",
                  file=sys.stderr)


def summarize(launches: list[dict[str, Any]]) -> dict[str, Any]:
    """Spreads of the first launches and of the warm ones, and how many missed their goal."""
    keys = ("click_to_store_s", "click_to_visible_s", "store_to_visible_s",
            "click_to_live_page_s")
    summary: dict[str, Any] = {}
    for group, goal_s in (("first", FIRST_LAUNCH_GOAL_S), ("warm", WARM_GOAL_S)):
        chosen = [launch for launch in launches if launch["first_of_server"] == (group == "first")]
        visible = [launch["click_to_visible_s"] for launch in chosen]
        summary[group] = {"goal_s": goal_s, "n": len(chosen),
                          "over_goal": sum(1 for value in visible if not value < goal_s),
                          **{key: spread(launch[key] for launch in chosen) for key in keys}}
    return summary


def end_standbys(home: Path, standby) -> None:
    """Shut the standby down until none is left: a stopped run's supervisor may leave a
    successor a moment after the first shutdown."""
    import psutil

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        standby.shutdown(home)
        left = [p for p in psutil.process_iter(["cmdline", "status"])
                if p.info["status"] != psutil.STATUS_ZOMBIE and str(home) in " ".join(
                    p.info["cmdline"] or []) and "engine.run.standby" in (p.info["cmdline"] or [])]
        workers = [run.id for run in store_runs(home) if run.is_active]
        if not left and not workers:
            return
        time.sleep(0.5)


def store_runs(home: Path) -> list:
    from engine.store import Store

    return Store(home).list_runs()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = browser_missing()
    if missing:
        print(f"bench.first_point_browser: {missing}", file=sys.stderr)
        return EXIT_NO_BROWSER
    machine = machine_info()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_first_point_browser_") as tmp:
        launches = measure(args, Path(tmp))
    elapsed_s = time.monotonic() - started
    summary = summarize(launches)

    print(f"bench.first_point_browser: Launch page defaults, Chromium; {args.servers} "
          f"server(s) x {args.launches} launches, {elapsed_s:.1f} s; load avg at start "
          f"{machine['load_avg_1_5_15_min']}")
    labels = {"click_to_store_s": "click -> first row in the store",
              "click_to_visible_s": "click -> first point visible in the browser",
              "store_to_visible_s": "row stored -> point visible (the page's delay)",
              "click_to_live_page_s": "click -> Live page open"}
    for group, words in (("first", "a server's first launch"), ("warm", "warm launches")):
        figures = summary[group]
        if not figures["n"]:
            continue
        print_table(f"Seconds, {words} (goal: visible < {figures['goal_s']} s)",
                    ["", "median", "min", "max", "n"],
                    [[labels[key], figures[key]["median"], figures[key]["min"],
                      figures[key]["max"], figures[key]["n"]] for key in labels])
        print(f"{words}: first point visible, median "
              f"{figures['click_to_visible_s']['median']:.2f} s; {figures['over_goal']} of "
              f"{figures['n']} at or over {figures['goal_s']} s")
    met = all(summary[group]["n"] and summary[group]["click_to_visible_s"]["median"]
              < summary[group]["goal_s"] for group in ("first", "warm")
              if summary[group]["n"])
    if args.json:
        emit_json({"benchmark": "first_point_browser", "target": WARM_GOAL_S,
                   "target_op": "<", "first_launch_goal_s": FIRST_LAUNCH_GOAL_S,
                   "click_to_visible_s": summary["warm"]["click_to_visible_s"]["median"],
                   "first_launch_click_to_visible_s":
                       summary["first"]["click_to_visible_s"]["median"],
                   "met": bool(met), "results": summary, "launches": launches,
                   "config": {"form": "Launch page defaults", "page_poll_ms": PAGE_POLL_MS,
                              "store_poll_s": STORE_POLL_S, "servers": args.servers,
                              "launches_per_server": args.launches},
                   "repeats": len(launches), "elapsed_s": elapsed_s, "machine": machine})
    return 0


if __name__ == "__main__":
    sys.exit(main())
