"""What-if validated: the projection of an fp32 step to bf16-amp, against a measurement.

    python -m bench.whatif [--workloads mlp:small:64,gpt:tiny:8,resnet:tiny:16]
                           [--budget-s 30] [--quick] [--json]

For each workload (model:size:batch, on this machine's CPU or first GPU):
  1. `python -m engine check` once, so this device's matmul rates per dtype are measured
     and stored (quiet ones only: what the projection reads);
  2. an fp32 run with its profiler window (`python -m engine run`), whose trace's time
     accounting is projected to "bf16 on this device" (engine.analysis.whatif: the matrix
     work at the bf16 rate, the rest unchanged);
  3. the paired speedup check fp32,bf16-amp (`python -m engine speedup`): the measured
     speedup with its 95 % interval;
and reports the projection error, projected / measured - 1. The benchmark passes when
every workload was measured and projected (or says why not: a busy machine's device
check stores no rate); the error is what it reports (docs: README,
Performance), not a target: the projection assumes the matrix work keeps its share of the
dtype's peak and nothing else changes, and autocast's casts, an emulated dtype's
conversion code or a different kernel choice break that in ways only a measurement sees.
The last stdout line with --json is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import REPO_ROOT, machine_info, print_table
from engine.analysis.speedup import mode_row

DEFAULT_WORKLOADS = "mlp:small:64,gpt:tiny:8,resnet:tiny:16"


def _engine(home: Path, *args: str, timeout_s: float) -> dict[str, Any]:
    env = dict(os.environ, PRECISION_LAB_HOME=str(home), PRECISION_LAB_STANDBY="0")
    proc = subprocess.run([sys.executable, "-m", "engine", *args, "--json"], cwd=str(REPO_ROOT),
                          env=env, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)
    if proc.returncode not in (0, 3):  # 3: a check that is inconclusive still measured
        raise RuntimeError(f"engine {args[0]} exited {proc.returncode}: "
                           f"{proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _projected(home: Path, run_id: str) -> dict[str, Any]:
    """The run's trace projected to bf16 on its device, as `engine kernels RUN --json`."""
    from engine.analysis.whatif import run_projection
    from engine.store import Store
    from engine.traces.explain import analyze, run_trace_path

    store = Store(home)
    run = store.get_run(run_id)
    path = run_trace_path(store, run)
    if path is None:
        return {"none": "the fp32 run recorded no profiler trace"}
    result = analyze(str(path), cpu_evidence=run.summary.get("cpu_evidence"))
    projection = run_projection(result, run)
    target = next((t for t in projection.get("targets", [])
                   if t["target"] == "bf16 on this device"), None)
    if target is None:
        return {"none": projection.get("none") or "no bf16 rate known for this device"}
    return {"speedup": target["speedup"], "untouched_share": target["untouched_share"],
            "basis": target["basis"], "words": target["words"],
            "run_busy": bool((run.summary.get("contention") or {}).get("busy"))}


def one_workload(home: Path, spec: str, device: str, budget_s: float, steps: int
                 ) -> dict[str, Any]:
    model, size, batch = spec.split(":")
    workload = ["--model", model, "--size", size, "--batch-size", batch, "--device", device]
    run = _engine(home, "run", *workload, "--precision", "fp32", "--steps", str(steps),
                  "--profile", timeout_s=1800)
    projected = _projected(home, run["run_id"])
    check = _engine(home, "speedup", *workload, "--precisions", "fp32,bf16-amp",
                    "--budget-s", str(budget_s), timeout_s=budget_s * 4 + 600)
    measured = mode_row(check, "bf16-amp")
    error_pct = (100.0 * (projected["speedup"] / measured["speedup"] - 1.0)
                 if projected.get("speedup") and measured.get("speedup") else None)
    return {"workload": spec, "projected_speedup": projected.get("speedup"),
            "projection": projected, "measured_speedup": measured.get("speedup"),
            "measured_ci": [measured.get("ci_low"), measured.get("ci_high")],
            "measured_verdict": measured.get("verdict"),
            "check_busy": bool((check.get("contention") or {}).get("busy")),
            "fp32_run_busy": projected.get("run_busy"), "error_pct": error_pct}


def bench(workloads: list[str], device: str, budget_s: float, steps: int) -> dict[str, Any]:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="precision-lab-whatif-") as tmp:
        home = Path(tmp) / "home"
        os.environ["PRECISION_LAB_HOME"] = str(home)  # the projection reads its peaks cache
        check = _engine(home, "check", "--device", device, timeout_s=600)
        rows = [one_workload(home, spec, device, budget_s, steps) for spec in workloads]
    errors = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
    # passes when every workload was measured and projected, or says why it was not (a
    # busy machine refuses the device check's rate: then no projection, with the reason)
    met = all(r["measured_speedup"] and (r["projected_speedup"] or r["projection"].get("none"))
              for r in rows)
    return {"benchmark": "whatif", "device": device,
            "device_name": (check.get("device") or {}).get("name")
            if isinstance(check.get("device"), dict) else check.get("device"),
            "workloads": rows, "budget_s": budget_s,
            "median_abs_error_pct": sorted(errors)[len(errors) // 2] if errors else None,
            "projected_all": len(errors) == len(rows), "met": met, "repeats": 1,
            "elapsed_s": time.perf_counter() - started,
            "machine": machine_info()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.whatif")
    parser.add_argument("--workloads", default=DEFAULT_WORKLOADS,
                        help="model:size:batch, comma-separated")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--budget-s", type=float, default=30.0)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--quick", action="store_true",
                        help="one small workload, 20 s check (set-up included)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    workloads = ["mlp:tiny:32"] if args.quick else args.workloads.split(",")
    budget_s = 20.0 if args.quick else args.budget_s
    result = bench(workloads, args.device, budget_s, 20 if args.quick else args.steps)
    print_table("what-if: fp32 -> bf16-amp, projected vs measured",
                ["workload", "projected", "measured", "95 % interval", "error %", "busy"],
                [[r["workload"], r["projected_speedup"], r["measured_speedup"],
                  f"{r['measured_ci'][0]}-{r['measured_ci'][1]}", r["error_pct"],
                  r["check_busy"]] for r in result["workloads"]])
    if args.json:
        print(json.dumps(result))
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
