"""Server-side render time of the Live, Runs and Compare pages at 20 runs x 100k steps.

    python -m bench.ui [--runs 20 --steps 100000 --repeats 3] [--json]

Each render is one `AppTest.run()` of app.py (st.navigation, the sidebar device card,
then the page). The figure is the script run itself on Streamlit's script thread (the
server-side work of a render; reruns included); the whole AppTest.run() is shown
beside it (it adds the test harness's own set-up and output parsing, ~150 ms here).
The store is the cached one of bench/_dataset.py (finished runs, PRECISION_LAB_HOME
pointed at it). Renders:
  launch (reference)  the default page: what app.py + a light page cost here
  live, new session   a fresh AppTest with session_state live_run_id set: the page's
                      first, downsampled read of the run plus its charts
  live, rerun         the same session again (what the 1 s refresh does: incremental read)
  runs                the runs table
  compare, default    the page's default selection (newest runs of one model at
                      different precisions)
  compare, N runs     every run of the store selected
The Compare page caches an ended run's chart rows once per server process (they never
change), so a page's first render after the server started is its slowest: the
"first" column shows it beside the median of the repeats.
Target < 300 ms. A page that misses it is rendered once more under a sampling
profiler (bench/_sampler.py: cProfile cannot see the script thread) and the functions
where its time goes are printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from bench._common import REPO_ROOT, emit_json, machine_info, print_table, spread

TARGET_MS = 300.0
BUDGET_S = 30.0  # the all-runs Compare renders start only before this
PROFILE_BUDGET_S = 45.0
APP = str(REPO_ROOT / "app.py")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.ui", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=100_000, help="logged steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="renders per page (default 3)")
    parser.add_argument("--cache-dir", default=None,
                        help="where the built store is cached (default: <tmp>/precision_lab_bench)")
    parser.add_argument("--no-all-runs", action="store_true",
                        help="skip the Compare render with every run selected")
    parser.add_argument("--no-profile", action="store_true",
                        help="do not profile the pages that miss the target")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 3 runs x 5k steps, 1 repeat, no profiling")
    parser.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.steps, args.repeats, args.no_profile = 3, 5_000, 1, True
    return args


def new_app(page: str | None = None, state: dict[str, Any] | None = None):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=300)
    for key, value in (state or {}).items():
        at.session_state[key] = value
    if page:
        at.switch_page(page)
    return at


class PageError(RuntimeError):
    """The page raised during a render: there is no render time to report."""


_SCRIPT_MS: list[float] = []


def install_script_clock() -> bool:
    """Time the script run itself on Streamlit's script thread (app.py, navigation and
    the page, reruns included): AppTest.run() also creates a test runtime, scans the
    installed packages for components on a pool thread and parses the output, ~150 ms
    here that a real server does not spend per render. False when this Streamlit has no
    ScriptRunner._run_script (then only AppTest.run() is timed)."""
    from streamlit.runtime.scriptrunner import script_runner

    original = getattr(script_runner.ScriptRunner, "_run_script", None)
    if original is None:
        return False

    def timed_run_script(self, rerun_data):
        start = time.perf_counter()
        try:
            return original(self, rerun_data)
        finally:
            _SCRIPT_MS.append((time.perf_counter() - start) * 1000.0)

    script_runner.ScriptRunner._run_script = timed_run_script
    return True


def render(at) -> tuple[float, float]:
    """(script ms, AppTest.run() ms) of one render; PageError when the page raised."""
    _SCRIPT_MS.clear()
    start = time.perf_counter()
    at.run()
    apptest_ms = (time.perf_counter() - start) * 1000.0
    if at.exception:
        details = [getattr(e, "message", "") or e.value for e in at.exception]
        raise PageError(f"the page raised: {details}"[:1000])
    return (sum(_SCRIPT_MS) if _SCRIPT_MS else apptest_ms), apptest_ms


def timings(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    return {"ms": spread(p[0] for p in pairs), "apptest_ms": spread(p[1] for p in pairs),
            "first_ms": pairs[0][0] if pairs else None}


def attempt(results: dict[str, dict[str, Any]], name: str,
            body: Callable[[], dict[str, Any]]) -> None:
    """results[name] = body(), or the page's error (reported, not hidden, not fatal)."""
    try:
        results[name] = body()
    except PageError as exc:
        results[name] = {"ms": spread([]), "error": str(exc)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    machine = machine_info()
    started = time.monotonic()
    import logging

    # AppTest in bare mode warns "missing ScriptRunContext" for every session_state
    # access from this thread; it is expected here and buries the output.
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(
        lambda record: "missing ScriptRunContext" not in record.getMessage())
    from bench._dataset import cached_store, describe

    home, info = cached_store(args.runs, args.steps,
                              Path(args.cache_dir) if args.cache_dir else None)
    os.environ["PRECISION_LAB_HOME"] = str(home)  # app.py's get_store() reads it
    # Renders only: no standby trainer (the app would start one and leave it idling).
    os.environ["PRECISION_LAB_STANDBY"] = "0"
    run_ids = info["run_ids"]
    live_id = run_ids[0]
    compare_exists = (REPO_ROOT / "pages" / "compare.py").exists()

    # Process warm-up: the first AppTest imports streamlit, plotly, torch (device card)...
    script_clock = install_script_clock()
    try:
        first_ms = render(new_app())[1]
    except PageError:
        first_ms = None  # app.py or the Launch page is broken: reported below

    scenarios: dict[str, Callable[[], Any]] = {}
    live_state = {"live_run_id": live_id}
    scenarios["launch (reference)"] = lambda: new_app()
    scenarios["live, new session"] = lambda: new_app("pages/live.py", live_state)
    scenarios["runs"] = lambda: new_app("pages/runs.py")
    if compare_exists:
        scenarios["compare, default selection"] = lambda: new_app("pages/compare.py")

    results: dict[str, dict[str, Any]] = {}
    last_app: dict[str, Any] = {}

    def repeated(name: str, make: Callable[[], Any]) -> dict[str, Any]:
        pairs = []
        for _ in range(args.repeats):
            last_app[name] = make()
            pairs.append(render(last_app[name]))
        return timings(pairs)

    for name, make in scenarios.items():
        attempt(results, name, lambda name=name, make=make: repeated(name, make))

    def live_rerun() -> dict[str, Any]:
        live_session = new_app("pages/live.py", live_state)
        render(live_session)
        return timings([render(live_session) for _ in range(args.repeats)])

    attempt(results, "live, rerun (1 s refresh)", live_rerun)
    default_selection = None
    skipped = []
    if compare_exists and "error" not in results["compare, default selection"]:
        default_selection = list(last_app["compare, default selection"]
                                 .session_state["compare_runs"])
        results["compare, default selection"]["runs_selected"] = len(default_selection)
        name = f"compare, all {len(run_ids)} runs selected"
        if args.no_all_runs:
            skipped.append(name + " (--no-all-runs)")
        elif time.monotonic() - started > BUDGET_S:
            skipped.append(f"{name} (time budget: {BUDGET_S:.0f} s spent)")
        else:
            all_state = {"compare_runs": list(run_ids), "compare_seen_preset": ()}
            attempt(results, name, lambda: {
                **timings([render(new_app("pages/compare.py", all_state))
                           for _ in range(args.repeats)]),
                "runs_selected": len(run_ids)})

    for result in results.values():
        result["met"] = "error" not in result and (result["ms"]["median"] or 0.0) < TARGET_MS
    errors = {name: r["error"] for name, r in results.items() if "error" in r}

    profiles: dict[str, list] = {}
    if not args.no_profile:
        from bench._sampler import StackSampler

        to_profile = {"live, new session": scenarios["live, new session"]}
        if compare_exists:
            to_profile["compare, default selection"] = scenarios["compare, default selection"]
        for name, make in to_profile.items():
            if results[name]["met"] or "error" in results[name]:
                continue
            if time.monotonic() - started > PROFILE_BUDGET_S:
                skipped.append(f"profile of {name} (time budget)")
                continue
            at = make()
            with StackSampler() as sampler:
                render(at)
            profiles[name] = {
                "script_thread_samples": sampler.samples,
                "other_thread_samples": sampler.other_samples,
                "top": [{"function": f, "cumulative": c, "self": s}
                        for f, c, s in sampler.top(18)]}
    elapsed_s = time.monotonic() - started

    page_results = {k: v for k, v in results.items() if not k.startswith("launch")}
    met = all(v["met"] for v in page_results.values())
    print(f"bench.ui: AppTest renders of app.py, {args.repeats} per page; first AppTest in "
          f"the process (imports) {first_ms or float('nan'):.0f} ms; {elapsed_s:.1f} s in all; "
          f"load avg at start {machine['load_avg_1_5_15_min']}")
    print(f"store: {describe(info)}")
    if not compare_exists:
        print("pages/compare.py does not exist here: Compare not measured")
    for item in skipped:
        print(f"skipped: {item}")
    clock = ("script run on Streamlit's script thread" if script_clock
             else "AppTest.run() (no script clock in this Streamlit)")
    print_table(f"Server-side render (ms: {clock}; target < {TARGET_MS:.0f})",
                ["render", "median", "min", "max", "first", "AppTest.run() median",
                 "runs selected", "met"],
                [[name, r["ms"]["median"], r["ms"]["min"], r["ms"]["max"], r.get("first_ms"),
                  r.get("apptest_ms", {}).get("median"), r.get("runs_selected"),
                  None if name.startswith("launch") else r["met"]]
                 for name, r in results.items()])
    for name, profile in profiles.items():
        print_table(f"Where '{name}' spends its time (share of "
                    f"{profile['script_thread_samples']} samples of the script thread; "
                    f"{profile['other_thread_samples']} samples of other threads not shown)",
                    ["function", "cumulative", "self"],
                    [[r["function"], f"{100 * r['cumulative']:.1f} %",
                      f"{100 * r['self']:.1f} %"] for r in profile["top"]])
    for name, error in errors.items():
        print(f"ERROR in '{name}': {error}")
    missed = [name for name, r in page_results.items() if not r["met"]]
    print(
        f"\ntarget < {TARGET_MS:.0f} ms: "
        f"{'met by every page' if met else 'MISSED by ' + ', '.join(missed)}"
    )
    if args.json:
        emit_json({
            "benchmark": "ui", "target": TARGET_MS, "target_op": "<", "met": met,
            "render_ms": {name: r["ms"]["median"] for name, r in results.items()},
            "results": results, "profiles": profiles, "missed": missed, "skipped": skipped,
            "errors": errors,
            "first_apptest_ms": first_ms, "compare_page": compare_exists,
            "clock": "script_thread" if script_clock else "apptest_run",
            "compare_default_selection": default_selection,
            "dataset": info | {"run_ids": None},
            "config": {"runs": args.runs, "steps": args.steps, "live_run_id": live_id},
            "repeats": args.repeats, "elapsed_s": elapsed_s, "machine": machine,
        })
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
