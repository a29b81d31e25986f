"""Instrumented training loop vs a bare PyTorch loop: throughput ratio, side by side.

    python -m bench.overhead [--model gpt --size tiny --precision fp32 --batch-size 16]
        [--model torchvision:resnet50 --image-size 32 | --model hf:gpt2 --seq-len 64]
        [--device auto --log-interval 1 --rounds 10 --threads N] [--json]

The instrumented side is the real thing: `engine.training.loop.train` with a store-backed
`emit` (a real `engine.run.session.MetricBuffer` on a temporary Store, flushing to SQLite
every 0.5 s) and a real `TelemetrySampler` thread writing telemetry rows, profiler off
(the issue excludes the profiler window). It is run at `--log-interval` (default 1:
one host sync and one metric row per step) and at log_interval 10.

The bare side is the loop a user would write: the same model (`build_model`), data
(`SyntheticTask`), optimizer, precision plan (autocast / GradScaler), seed and steps,
and nothing else: no metric rows, no gradient norm, no per-step sync.

Only steady steps are timed (the first `--warmup` steps of every run are dropped), by
the wall clock, so every timed step's logging, flushing and telemetry cost is inside.
The self-reported throughput of `train()` is printed beside it: its clock stops before
`emit()`, so it cannot see the cost of logging.

Pairing (how the two sides share the machine's noise):
  steps  (default on CPU) one bare step runs right before every instrumented step, in
         the instrumented run's own `should_stop` hook: each pair of steps sees the same
         neighbours. A shared 2-core box moves throughput by 2x within seconds, which
         run-level alternation cannot average away in a minute.
  runs   (default on CUDA) whole runs alternate, bare / li=N / li=10, the order rotating
         every round; both sides synchronize at the window edges only (a per-step pair
         would need a sync per step, which the instrumented loop does not do at li=10).
In pairing=steps the wall clock also runs during the bare steps, so MetricBuffer's 0.5 s
flush interval is stretched by the measured (bare + instrumented) / instrumented time:
flushes per instrumented step stay those of a real run.

The figure is the median over rounds of instrumented / bare throughput. Target >= 0.98.
Also printed: the ratio of median step times (robust to neighbours, blind to the
periodic flushes), the absolute extra ms per step (which sets the ratio for any other
step time: ~ T / (T + extra)), the share of time spent in emit(), and flush latencies.
On CPU the benchmark runs one torch
thread by default (see --threads).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench._common import emit_json, machine_info, print_table, spread

TARGET_RATIO = 0.98
BUDGET_S = 35.0  # no new round starts after this long (each benchmark: under a minute)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt")
    parser.add_argument("--size", default="tiny", help="mlp/resnet/gpt only")
    parser.add_argument("--image-size", type=int, default=None,
                        help="image side in px (image models; default RunConfig's 32)")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="tokens per sequence (sequence models; default RunConfig's 64)")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per run (default: enough for --window-s of timed steps)")
    parser.add_argument("--window-s", type=float, default=2.0,
                        help="timed instrumented time per run when --steps is not given "
                             "(default 2 s: several 0.5 s flushes land inside)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="leading steps of every run left out of the timing (default 5)")
    parser.add_argument("--rounds", type=int, default=10,
                        help=f"rounds; no new round starts after {BUDGET_S:.0f} s (default 10)")
    parser.add_argument("--log-interval", type=int, default=1,
                        help="the instrumented run's log_interval (default 1); 10 is always "
                             "measured too")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--pairing", choices=("auto", "steps", "runs"), default="auto",
                        help="steps: a bare step before every instrumented step (CPU "
                             "default); runs: whole runs alternate (CUDA default)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads; 0 = torch's default (what a worker "
                             "uses). Default on CPU: 1, because two OpenMP threads on a "
                             "shared 2-core box swing a gpt-tiny step between 17 and 440 ms "
                             "within a minute (spin-waiting on a descheduled peer), which "
                             "buries a 2 %% effect; the absolute +ms/step carries over.")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true",
                        help="smallest useful run (smoke tests): mlp tiny, 12 steps, 1 round")
    parser.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.size, args.steps, args.warmup, args.rounds = "mlp", "tiny", 12, 3, 1
    if args.steps is not None and args.steps < args.warmup + 3:
        parser.error(f"--steps {args.steps}: need at least --warmup + 3 = {args.warmup + 3}")
    return args


# ---------------------------------------------------------------------------------------
# the two sides


class Window:
    """Wall-clock marks at the start of every step; the timed window runs from the start
    of step `first` to the start of step `last`, so the steps in it are complete."""

    def __init__(self, first: int, last: int, sync: Callable[[], None],
                 deadline_s: float | None = None):
        self.first, self.last, self.sync = first, last, sync
        self.deadline_s = deadline_s
        self.marks: list[float] = []

    def at_step_start(self, step: int) -> bool:
        """Mark the step; True when the run should end here (the time budget is spent)."""
        stop = _past(self.deadline_s) and self.first + 3 <= step < self.last
        if stop:
            self.last = step  # a shorter window, still of complete steps
        if step == self.first or step == self.last:
            self.sync()  # CUDA: the queued work of the steps before is done (no-op on CPU)
        if self.first <= step <= self.last:
            self.marks.append(time.perf_counter())
        return stop

    @property
    def steps(self) -> int:
        return self.last - self.first

    @property
    def seconds(self) -> float:
        return self.marks[-1] - self.marks[0]

    def median_step_s(self) -> float:
        """Robust to a neighbour stealing the CPU for one step, blind to periodic costs
        (a flush every 0.5 s): reported beside the wall-clock figure, not instead of it."""
        gaps = sorted(b - a for a, b in zip(self.marks, self.marks[1:]))
        return gaps[len(gaps) // 2]


def bare_step_fn(cfg, device) -> Callable[[], None]:
    """The user's own loop body: model, data, optimizer, autocast/GradScaler, nothing else."""
    import torch
    import torch.nn.functional as F

    from engine.training.data import SyntheticTask
    from engine.training.models import build_model
    from engine.training.precision import cast_inputs, make_plan, prepare_model

    torch.manual_seed(cfg.seed)
    plan = make_plan(cfg, device)
    model = prepare_model(build_model(cfg), plan, device, cfg.channels_last)
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "sgd":
        optimizer = torch.optim.SGD(params, lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay)
    else:
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    task = SyntheticTask(cfg, device)
    scaler = plan.scaler

    def train_step() -> None:
        # A function, as in most user code: its temporaries (batch, logits, loss) are
        # freed at return, as in Trainer.step. A loop body that keeps them alive into the
        # next step changes the allocator's pattern; measured here it moved the bare
        # side by ~5 %, more than the effect this benchmark looks for.
        inputs, targets = task.batch()
        with plan.autocast():
            logits = model(cast_inputs(inputs, plan))
        logits = logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return train_step


def bare_run(cfg, device, window: Window) -> None:
    train_step = bare_step_fn(cfg, device)
    for step in range(1, cfg.steps + 1):
        if window.at_step_start(step):
            break
        train_step()


def _past(deadline_s: float | None) -> bool:
    return deadline_s is not None and time.perf_counter() > deadline_s


class Interleaved:
    """`pairing=steps`: one bare step before every instrumented step, both timed.

    At the start of instrumented step k (its `should_stop` call) the bare step k runs;
    the instrumented step k lasts from the end of bare step k to the next call.
    """

    def __init__(self, bare_step: Callable[[], None], first: int, last: int,
                 deadline_s: float | None = None):
        self.bare_step, self.first, self.last = bare_step, first, last
        self.deadline_s = deadline_s
        self.bare_steps: list[float] = []
        self.instr_steps: list[float] = []
        self.window_start_s = self.window_end_s = None
        self._instr_started_s = None

    def at_step_start(self, step: int) -> bool:
        """Run and time bare step `step`; True when the run should end here."""
        now = time.perf_counter()
        stop = _past(self.deadline_s) and self.first + 3 <= step < self.last
        if stop:
            self.last = step
        if self._instr_started_s is not None and self.first < step <= self.last:
            self.instr_steps.append(now - self._instr_started_s)
        if step == self.first:
            self.window_start_s = now
        if step == self.last:
            self.window_end_s = now
        if step < self.last:
            start = time.perf_counter()
            self.bare_step()
            end = time.perf_counter()
            if step >= self.first:
                self.bare_steps.append(end - start)
        self._instr_started_s = time.perf_counter()
        return stop

    def in_window(self, start_s: float, end_s: float) -> bool:
        return self.window_start_s <= start_s and end_s <= self.window_end_s

    @property
    def steps(self) -> int:
        return self.last - self.first


@dataclass
class Variant:
    """One instrumented configuration."""
    name: str
    cfg: Any


def instrumented_run(variant: Variant, device_key: str, store, clock,
                     flush_interval_s: float | None = None) -> dict[str, Any]:
    """engine.training.loop.train as the worker calls it: MetricBuffer emit + TelemetrySampler.

    `clock` (a Window or an Interleaved) is called at the start of every step from the
    `should_stop` hook, which train() calls first thing in each step.
    `flush_interval_s` stretches MetricBuffer's 0.5 s (pairing=steps, see main()).
    """
    import engine.run.session as session
    from engine.hardware.telemetry import TelemetrySampler
    from engine.run.session import MetricBuffer
    from engine.schema import FINISHED
    from engine.training.loop import train

    cfg = variant.cfg
    run_id = store.create_run(cfg, device_key, "bench.overhead")
    store.set_status(run_id, "running")
    buffer = MetricBuffer(store, run_id)
    flush_ms: list[float] = []
    real_flush = buffer.flush

    def timed_flush() -> None:  # same work; we only note how long the loop waited
        start = time.perf_counter()
        real_flush()
        flush_ms.append((time.perf_counter() - start) * 1000.0)

    buffer.flush = timed_flush
    emits: list[tuple[float, float]] = []

    def emit(rows) -> None:  # the real MetricBuffer; we only add a clock around it
        start = time.perf_counter()
        buffer(rows)
        emits.append((start, time.perf_counter()))

    sampler = TelemetrySampler(device_key, lambda rows: store.write_telemetry(run_id, rows))
    calls = [0]

    def should_stop() -> bool:  # called at the start of every step: our clock's hook
        calls[0] += 1
        return clock.at_step_start(calls[0])

    saved_interval = session.FLUSH_INTERVAL_S
    if flush_interval_s is not None:
        session.FLUSH_INTERVAL_S = flush_interval_s  # read by MetricBuffer at every call
    sampler.start()
    try:
        result = train(cfg, device_key, emit=emit, should_stop=should_stop,
                       run_dir=store.run_dir(run_id), peak_flops=1e12)
    finally:
        sampler.stop()
        session.FLUSH_INTERVAL_S = saved_interval
    buffer.close()
    store.set_status(run_id, FINISHED)
    if isinstance(clock, Interleaved):
        window_s, inside = sum(clock.instr_steps), clock.in_window
    else:
        window_s = clock.seconds
        inside = lambda a, b: clock.marks[0] <= a and b <= clock.marks[-1]  # noqa: E731
    in_window = [(a, b) for a, b in emits if inside(a, b)]
    return {"self_reported_samples_per_s": result.samples_per_s,
            "metric_rows": store.metrics_count(run_id),
            "telemetry_rows": sampler.rows_emitted,
            "flushes": len(flush_ms), "flush_ms_max": max(flush_ms) if flush_ms else None,
            "flush_ms_median": _median(flush_ms) if flush_ms else None,
            # share of the instrumented steps' time spent inside emit() (flushes included)
            "emit_share": sum(b - a for a, b in in_window) / window_s}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


# ---------------------------------------------------------------------------------------


def measure(args, variants: list[Variant], device, device_key: str, sync, pairing: str,
            store) -> dict[str, Any]:
    """Rounds of every variant against the bare loop; per-round ratios and extras."""
    first, last, batch = args.warmup + 1, args.steps, args.batch_size
    base_cfg = variants[0].cfg
    names = [v.name for v in variants]
    out = {"ratio": {n: [] for n in names}, "step_ratio": {n: [] for n in names},
           "overhead_ms": {n: [] for n in names},
           "samples_per_s": {n: [] for n in ["bare", *names]}, "extras": {n: [] for n in names}}
    # pairing=steps: wall time per instrumented step includes the bare step before it, so
    # a flush every 0.5 s of wall time would come ~twice per instrumented step as often
    # as in a real run. The flush interval is stretched by the measured factor
    # (wall time / instrumented time, from the previous run; 2 to start with).
    stretch = 2.0
    started = time.monotonic()
    # A hard stop inside a run too: a neighbour can make one run take 10x its calibration.
    deadline_s = time.perf_counter() + args.budget_s + 8.0
    for rnd in range(args.rounds):
        if rnd and time.monotonic() - started > args.budget_s:
            break
        if pairing == "steps":
            for variant in (variants if rnd % 2 == 0 else variants[::-1]):
                clock = Interleaved(bare_step_fn(base_cfg, device), first, last, deadline_s)
                extra = instrumented_run(variant, device_key, store, clock,
                                         flush_interval_s=0.5 * stretch)
                bare_s, instr_s = sum(clock.bare_steps), sum(clock.instr_steps)
                stretch = (bare_s + instr_s) / instr_s
                out["extras"][variant.name].append({**extra, "flush_interval_s": 0.5 * stretch})
                out["samples_per_s"][variant.name].append(clock.steps * batch / instr_s)
                out["samples_per_s"]["bare"].append(clock.steps * batch / bare_s)
                out["ratio"][variant.name].append(bare_s / instr_s)
                out["overhead_ms"][variant.name].append(1000.0 * (instr_s - bare_s) / clock.steps)
                out["step_ratio"][variant.name].append(_median(clock.bare_steps)
                                                       / _median(clock.instr_steps))
            continue
        sides = ["bare", *names]
        order = sides[rnd % len(sides):] + sides[:rnd % len(sides)]  # rotate
        windows: dict[str, Window] = {}
        for side in order:
            window = windows[side] = Window(first, last, sync, deadline_s)
            if side == "bare":
                bare_run(base_cfg, device, window)
            else:
                variant = variants[names.index(side)]
                out["extras"][side].append(instrumented_run(variant, device_key, store, window))
            out["samples_per_s"][side].append(window.steps * batch / window.seconds)
        for name in names:
            bare_step_s = windows["bare"].seconds / windows["bare"].steps
            instr_step_s = windows[name].seconds / windows[name].steps
            out["ratio"][name].append(bare_step_s / instr_step_s)
            out["overhead_ms"][name].append(1000.0 * (instr_step_s - bare_step_s))
            out["step_ratio"][name].append(windows["bare"].median_step_s()
                                           / windows[name].median_step_s())
    out["elapsed_s"] = time.monotonic() - started
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    machine = machine_info()  # load average at start, before we add our own
    import torch

    from engine.config import RunConfig
    from engine.hardware.devices import resolve_device_key
    from engine.store import Store
    from engine.training.loop import resolve_torch_device

    device_key = resolve_device_key(args.device)
    device = resolve_torch_device(device_key)
    if args.threads is None and device.type == "cpu":
        args.threads = 1
    if args.threads:
        torch.set_num_threads(args.threads)
    pairing = args.pairing if args.pairing != "auto" else (
        "runs" if device.type == "cuda" else "steps")
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    first = args.warmup + 1

    def config(log_interval: int):
        return RunConfig(model=args.model, size=args.size, precision=args.precision,
                         batch_size=args.batch_size, steps=args.steps or first + 6, profile=False,
                         log_interval=log_interval, warmup_steps=min(3, args.warmup),
                         device=device_key, **input_sizes)

    # Only the sizes given: RunConfig's defaults otherwise (tiny inputs, fast on a CPU).
    input_sizes = {name: value for name, value in (("image_size", args.image_size),
                                                   ("seq_len", args.seq_len)) if value}

    li = args.log_interval
    with tempfile.TemporaryDirectory(prefix="bench_overhead_") as tmp:
        store = Store(Path(tmp) / "home")
        # One discarded run of each kind first: the process's first steps pay one-time
        # costs (lazy imports, oneDNN primitive creation, allocator growth) that the
        # per-run warm-up steps do not cover, and they would land on whichever side ran
        # first. The bare one also calibrates the number of steps.
        warm = Variant("warm", config(li).replace(steps=first + 6))
        calibration = Window(first, first + 6, sync)
        bare_run(warm.cfg, device, calibration)
        instrumented_run(warm, device_key, store, Window(first, first + 6, sync))
        if args.steps is None:
            step_s = calibration.median_step_s()
            args.steps = first + max(3, min(5000, int(args.window_s / step_s) + 1))
        variants = [Variant(f"li={li}", config(li))]
        if li != 10:
            variants.append(Variant("li=10", config(10)))
        m = measure(args, variants, device, device_key, sync, pairing, store)

    results = {}
    for v in variants:
        extras = m["extras"][v.name]
        self_reported = [e["self_reported_samples_per_s"] for e in extras]
        results[v.name] = {
            "log_interval": v.cfg.log_interval,
            "throughput_ratio": spread(m["ratio"][v.name]),
            "median_step_ratio": spread(m["step_ratio"][v.name]),
            # instrumented minus bare wall time per step: the absolute cost, which sets the
            # ratio for other step times (ratio ~ T / (T + overhead))
            "overhead_ms_per_step": spread(m["overhead_ms"][v.name]),
            "instrumented_samples_per_s": spread(m["samples_per_s"][v.name]),
            "emit_share": spread(e["emit_share"] for e in extras),
            "flush_ms_median": spread(e["flush_ms_median"] for e in extras)["median"],
            "flush_ms_max": max((e["flush_ms_max"] or 0.0) for e in extras),
            # train()'s own figure over the wall clock around it (it leaves emit() out);
            # with pairing=steps its clock also runs during our bare steps: not comparable.
            "self_reported_over_wall": spread(
                s / w for s, w in zip(self_reported, m["samples_per_s"][v.name])
                if s and pairing == "runs"),
            "metric_rows_per_run": extras[-1]["metric_rows"],
            "telemetry_rows_per_run": extras[-1]["telemetry_rows"],
        }
    headline = results[variants[0].name]["throughput_ratio"]["median"]
    rounds_done = len(m["ratio"][variants[0].name])
    bare = spread(m["samples_per_s"]["bare"])
    met = headline is not None and headline >= TARGET_RATIO

    model_label = args.model if ":" in args.model else f"{args.model}-{args.size}"
    print(f"bench.overhead: {model_label} {args.precision} batch {args.batch_size} "
          f"on {device_key} ({torch.get_num_threads()} torch threads), pairing={pairing}, "
          f"{args.steps} steps/run, timed steps {first}..{args.steps - 1}, {rounds_done} "
          f"rounds in {m['elapsed_s']:.1f} s; load avg at start {machine['load_avg_1_5_15_min']}")
    print_table("Throughput (samples/s; ratios: median over rounds [min..max])",
                ["side", "samples/s", "ratio vs bare", "ratio min", "ratio max",
                 "median-step ratio", "+ms/step", "in emit()", "flush ms med", "flush ms max",
                 "self-report/wall"],
                [["bare", bare["median"], 1.0, None, None, 1.0, None, None, None, None, None]]
                + [[f"instrumented {name}", r["instrumented_samples_per_s"]["median"],
                    r["throughput_ratio"]["median"], r["throughput_ratio"]["min"],
                    r["throughput_ratio"]["max"], r["median_step_ratio"]["median"],
                    r["overhead_ms_per_step"]["median"],
                    f"{100 * r['emit_share']['median']:.2f} %", r["flush_ms_median"],
                    r["flush_ms_max"], r["self_reported_over_wall"]["median"]]
                   for name, r in results.items()])
    print("  ratio vs bare: instrumented / bare samples/s over the timed steps (the headline)\n"
          "  median-step ratio: the same from median step times (robust to neighbours, blind\n"
          "    to the periodic 0.5 s flushes)\n"
          "  +ms/step: instrumented minus bare wall time per step\n"
          "  in emit(): share of the instrumented steps' time spent in emit(), flushes included\n"
          "  self-report/wall: train()'s own samples/s over the wall-clock figure (pairing=runs"
          " only)")
    print(f"\nthroughput_ratio (instrumented / bare, log_interval={li}) = {headline:.4f}; "
          f"target >= {TARGET_RATIO}: {'met' if met else 'MISSED'}")
    if args.json:
        emit_json({
            "benchmark": "overhead", "throughput_ratio": headline, "target": TARGET_RATIO,
            "target_op": ">=", "met": met, "log_interval": li, "results": results,
            "bare_samples_per_s": bare,
            "per_round": {"ratio": m["ratio"], "samples_per_s": m["samples_per_s"]},
            "config": {"model": args.model, "size": args.size, "precision": args.precision,
                       "batch_size": args.batch_size, "steps": args.steps,
                       "timed_steps_planned": args.steps - first, "warmup_dropped": args.warmup,
                       "device": device_key, "torch_threads": torch.get_num_threads(),
                       "pairing": pairing, "profile": False},
            "repeats": rounds_done, "elapsed_s": m["elapsed_s"], "machine": machine,
        })
    return 0


if __name__ == "__main__":
    sys.exit(main())
