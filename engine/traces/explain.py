"""One trace explained (Tensor-Core verdict + time accounting + bound-by verdict + the
banner a page shows), and two traces compared: why is run B faster (or not) than run A?

The B-vs-A split is Amdahl's law made visible: each part of A's step (matrix, attention,
elementwise, ...; engine.traces.accounting.PARTS) with its time in A and in B, its
speedup and its share of A's step. A 3x faster matmul in a step that is 40 % matmul gives
at most 1.4x; the table says which part held the rest back.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from engine.display import ratio_text, share_text, step_time_text
from engine.schema import RANK_TRACE_PATTERN, TRACE_FILENAME
from engine.traces.accounting import (
    CAST_OPS,
    PARTS,
    part_shares,
    step_kernel_table,
    time_accounting,
)
from engine.traces.bound import bound_by, busy_headline
from engine.traces.kernels import MATRIX_CATEGORIES
from engine.traces.kinds import other_kind_result
from engine.traces.op_rates import op_rates_summary
from engine.traces.parser import ParsedTrace, load_trace
from engine.traces.reader import collector_paused
from engine.traces.verdict import (
    UNATTRIBUTED_OP,
    breakdown,
    kernel_groups,
    short_kernel_name,
)

UNCHANGED = 0.05  # a part within +-5 % of its A time is "unchanged"
# the window's step ratio and the steady steps' ratio further apart than this: say so
WINDOW_DISAGREES = 0.25
SENTENCE_MIN_SHARE = 0.05  # parts below 5 % of A's step stay out of the sentence
ONLY_IN_LIMIT = 10
# The profiler's span around each autograd node ("...: ToCopyBackward0") encloses the node's
# own span: listing both would count one backward op twice.
_AUTOGRAD_WRAPPER = "autograd::engine::evaluate_function: "
# GPU: the dtype-converting copy kernels; CPU: the cast ops and their autograd nodes.
_CAST_NAME = re.compile(r"(?<![a-z])(?:to_copy|_to_copy|convert\w*|cast)(?![a-z])|ToCopyBackward")


def _parsed(trace: Any) -> ParsedTrace:
    return trace if isinstance(trace, ParsedTrace) else load_trace(trace)


def analyze(trace: Any, step: int | None = None, data_wait_ms: float | None = None,
            cpu_evidence: dict | None = None) -> dict:
    """Everything `python -m engine kernels TRACE --json` prints: traces.breakdown's keys
    plus "accounting" (time_accounting), "bound_by" (bound.bound_by), "banner"
    ({"headline", "tone", "sentence", "advice"}), the flat figures "busy_us", "idle_us",
    "idle_share", "copy_us", "overlap_us", "streams", "steps", "trace_defects", and
    "breakdown_scope" (which kernels the Tensor-Core figures cover: every kernel in the
    trace, or those of the chosen step)."""
    with collector_paused():  # a big trace's analysis (see trace_reader.collector_paused)
        return _analyze(_parsed(trace), step, data_wait_ms, cpu_evidence)


def _analyze(parsed: ParsedTrace, step: int | None, data_wait_ms: float | None,
             cpu_evidence: dict | None) -> dict:
    if parsed.kind in ("range profiler", "other accelerator"):
        return other_kind_result(parsed)  # no kernel timeline: never read as a CPU run
    accounting = time_accounting(parsed, step=step, cpu_evidence=cpu_evidence)
    if step is None or not parsed.is_gpu:
        table, scope = parsed.table, "every kernel in the trace"
    else:
        table, scope = step_kernel_table(parsed, step), f"the kernels of ProfilerStep#{step}"
    result = {"source": parsed.source, **breakdown(table), "breakdown_scope": scope}
    result.update(op_rates_summary(parsed, result["verdict"].get("tensor_cores")))
    verdict = bound_by(accounting, data_wait_ms=data_wait_ms)
    defects = dict(parsed.defects)
    result.update(
        malformed_events=defects.get("malformed_events", 0),
        bad_duration_events=defects.get("negative_duration", 0)
        + defects.get("missing_duration", 0),
        trace_defects=defects, accounting=accounting, bound_by=verdict,
        busy_us=accounting["busy_us"], idle_us=accounting["idle_us"],
        idle_share=accounting["idle_share"], copy_us=accounting.get("copy_us"),
        overlap_us=accounting.get("overlap_us"), streams=accounting.get("streams", []),
        steps=accounting.get("steps", []),
        banner=_banner(result["verdict"], accounting, verdict),
        # what-if (analysis.whatif): the dtype today's matrix work ran in; a CPU trace does
        # not say it (the caller that knows the run sets it)
        matrix_dtype=_label(parsed, None, "") or None if parsed.is_gpu else None)
    return result


def _banner(tensor_verdict: dict, accounting: dict, verdict: dict) -> dict:
    if accounting["kind"] == "cpu":
        headline = f"CPU run: {verdict['label']}"  # the sentence follows with the numbers
        tone = "info"
    else:
        headline = busy_headline(tensor_verdict.get("headline") or "", accounting)
        tone = {"yes": "success", "partly": "warning", "no": "error"}.get(
            tensor_verdict.get("tensor_cores"), "info")
    return {"headline": headline, "tone": tone, "sentence": verdict["sentence"],
            "advice": verdict["advice"]}


# ---------------------------------------------------------------------------------------
# B vs A

def _label(parsed: ParsedTrace, given: str | None, fallback: str) -> str:
    """The caller's label, else the dominant dtype of the matrix kernels (fp32, bf16)."""
    if given:
        return given
    matrix = [g for g in kernel_groups(parsed.table) if g.is_matrix and g.dtype]
    dtypes: dict[str, float] = {}
    for group in matrix:
        dtypes[group.dtype] = dtypes.get(group.dtype, 0.0) + group.us
    return max(dtypes, key=dtypes.get) if dtypes else fallback


def _speedup_words(speedup: float | None, b_us: float, part: str | None = None) -> str:
    if b_us <= 0:
        return "gone"
    if speedup is None:
        return "new"
    if abs(speedup - 1.0) <= UNCHANGED:
        return "unchanged"
    slower = "longer" if part == "idle" else "slower"  # idle time is not "faster"
    return f"{speedup:.1f}x" if speedup > 1 else f"{1 / speedup:.1f}x {slower}"


def _name_totals(parsed: ParsedTrace) -> dict[str, dict]:
    """{name: {"us", "count", "category"}} of the kernels (GPU) or CPU ops (CPU)."""
    totals: dict[str, dict] = {}
    if parsed.is_gpu:
        for group in kernel_groups(parsed.table):
            entry = totals.setdefault(group.name, {
                "us": 0.0, "count": 0, "category": group.category,
                "tensor_core": group.tensor_core, "dtype": group.dtype})
            entry["us"] += group.us
            entry["count"] += group.count
        return totals
    for name, start, end, *_ in parsed.cpu_ops:
        if name.startswith(_AUTOGRAD_WRAPPER):  # wraps the node it names: counted once
            continue
        entry = totals.setdefault(name, {"us": 0.0, "count": 0, "category": None})
        entry["us"] += end - start
        entry["count"] += 1
    return totals


def _note(name: str, entry: dict, other_uses_tensor_cores: bool) -> str | None:
    if name in CAST_OPS or _CAST_NAME.search(name):
        return "cast (dtype conversion)"
    if entry.get("category") == "copy kernel":
        return "copy kernel (a cast when the dtypes differ)"
    if (other_uses_tensor_cores and entry.get("category") in MATRIX_CATEGORIES
            and entry.get("tensor_core") == "no" and entry.get("dtype") in ("fp32", None)):
        return "fp32 matrix kernel on CUDA cores (a fallback?)"
    return None


def _only_in(mine: dict, theirs: dict, steps: int) -> list[dict]:
    theirs_tc = any(entry.get("tensor_core") == "yes" for entry in theirs.values())
    mine_tc = any(entry.get("tensor_core") == "yes" for entry in mine.values())
    rows = [{"name": name, "us_per_step": round(entry["us"] / steps, 3),
             "count": entry["count"], "category": entry.get("category"),
             "note": _note(name, entry, theirs_tc or mine_tc)}
            for name, entry in mine.items() if name not in theirs]
    rows.sort(key=lambda row: -row["us_per_step"])
    return rows[:ONLY_IN_LIMIT]


def _sentence(rows: list[dict], label_a: str, label_b: str, step_speedup: float | None,
              step_a_us: float, step_b_us: float) -> str:
    """Parts ordered by how much of the step change they carry (|A - B| per step: what
    moves the total, Amdahl's law), each with its share of A and its speedup; a part below
    5 % of A's step is named only when its change is 5 % of the larger step."""
    larger_us = max(step_a_us, step_b_us)
    shown = [row for row in rows if (row["share_of_a"] or 0) >= SENTENCE_MIN_SHARE
             or (larger_us and abs(row["saved_us"]) >= SENTENCE_MIN_SHARE * larger_us)]
    shown.sort(key=lambda row: -abs(row["saved_us"]))
    pieces = []
    for index, row in enumerate(shown[:5]):
        words = _speedup_words(row["speedup"], row["b_us"], row["part"])
        if words.endswith("x") and (index == 0 or row["part"] == "idle"):
            words += " shorter" if row["part"] == "idle" else " faster"
        if index == 0:
            pieces.append(f"{row['part']} {share_text(row['share_of_a'])} of the {label_a} step, "
                          f"{words} in {label_b}")
        else:
            pieces.append(f"{row['part']} {share_text(row['share_of_a'])}, {words}")
    total = _speedup_words(step_speedup, 1.0) if step_speedup else "n/a"
    total = total if total != "unchanged" else "unchanged (1.0x)"
    total += " faster" if total.endswith("x") else ""
    text = "; ".join(pieces) + f" -> step {total}"
    return text[:1].upper() + text[1:]


def explain_diff(trace_a: Any, trace_b: Any, label_a: str | None = None,
                 label_b: str | None = None, step_a: int | None = None,
                 step_b: int | None = None, cpu_evidence_a: dict | None = None,
                 cpu_evidence_b: dict | None = None) -> dict:
    """Why B's step is faster (or slower) than A's.

    `trace_a`/`trace_b`: ParsedTrace, path or file object; both GPU or both CPU traces
    (ValueError otherwise). Labels default to the dominant matrix dtype (GPU) or "A"/"B".

    -> {"kind", "label_a", "label_b", "step_time_a_us", "step_time_b_us", "step_speedup",
        "parts": [{"part", "a_us", "b_us", "speedup", "share_of_a", "saved_us"}] (per step,
        PARTS order; a_us adds up to step_time_a_us), "sentence", "only_in_a", "only_in_b"
        ([{"name", "us_per_step", "count", "category", "note"}]), "bound_by_a",
        "bound_by_b", "device_a", "device_b", "steps_a", "steps_b" (profiled steps), "caveats"
        ([{"text", "severity"}] a reader must see beside the figures: two different GPUs)}
    """
    parsed_a, parsed_b = _parsed(trace_a), _parsed(trace_b)
    if parsed_a.is_gpu != parsed_b.is_gpu:
        kinds = ("a GPU" if parsed_a.is_gpu else "a CPU", "a GPU" if parsed_b.is_gpu else "a CPU")
        raise ValueError(f"cannot compare {kinds[0]} trace ({parsed_a.source}) with {kinds[1]} "
                         f"trace ({parsed_b.source}): the parts are measured differently; "
                         "compare two GPU traces or two CPU traces")
    acc_a = time_accounting(parsed_a, step=step_a, cpu_evidence=cpu_evidence_a)
    acc_b = time_accounting(parsed_b, step=step_b, cpu_evidence=cpu_evidence_b)
    label_a, label_b = _label(parsed_a, label_a, "A"), _label(parsed_b, label_b, "B")
    if label_a == label_b:
        label_a, label_b = f"{label_a} (A)", f"{label_b} (B)"
    step_a_us, step_b_us = acc_a["step_time_us"] or 0.0, acc_b["step_time_us"] or 0.0
    rows = []
    shares_a = part_shares(acc_a)  # the figures run A's own Kernels page shows
    for part in PARTS:
        a_us, b_us = acc_a["parts_per_step_us"][part], acc_b["parts_per_step_us"][part]
        rows.append({"part": part, "a_us": a_us, "b_us": b_us,
                     # 4 significant digits: round(x, 3) made a 600x slowdown 0.0
                     "speedup": float(f"{a_us / b_us:.4g}") if b_us > 0 and a_us > 0 else None,
                     "share_of_a": shares_a.get(part) if step_a_us else None,
                     "saved_us": round(a_us - b_us, 3)})
    step_speedup = round(step_a_us / step_b_us, 3) if step_b_us else None
    names_a, names_b = _name_totals(parsed_a), _name_totals(parsed_b)
    device_a, device_b = parsed_a.table.attrs.get("device"), parsed_b.table.attrs.get("device")
    caveats = [_caveat(f"{side}: ProfilerStep#{step} only", "note")
               for side, step in (("A", step_a), ("B", step_b)) if step is not None]
    if device_a and device_b and device_a != device_b:
        caveats.append(_caveat(f"A ran on {device_a}, B on {device_b}: the parts compare two "
                               "different GPUs, not only two precisions"))
    shared = shared_work_share(work_totals(parsed_a), work_totals(parsed_b))
    differs = what_differs(parsed_a, parsed_b, shared)
    if shared is not None and shared < SAME_WORK_SHARE:
        caveats.insert(0, _caveat(
            f"A and B ran different work: their {'kernel' if parsed_a.is_gpu else 'op'} time "
            f"overlaps only {shared * 100:.0f} % by what launched it (different models, shapes "
            "or batch sizes), so the ratio compares two workloads, not two precisions",
            key=WORK_CAVEAT))
    return {
        "differs": differs,
        "kind": acc_a["kind"], "label_a": label_a, "label_b": label_b,
        "source_a": parsed_a.source, "source_b": parsed_b.source,
        "device_a": device_a, "device_b": device_b, "caveats": caveats,
        "steps_a": acc_a["window"]["step_count"], "steps_b": acc_b["window"]["step_count"],
        "step_time_a_us": step_a_us, "step_time_b_us": step_b_us, "step_speedup": step_speedup,
        "parts": rows, "sentence": _sentence(rows, label_a, label_b, step_speedup, step_a_us,
                                             step_b_us),
        "only_in_a": _only_in(names_a, names_b, acc_a["window"]["step_count"]),
        "only_in_b": _only_in(names_b, names_a, acc_b["window"]["step_count"]),
        "bound_by_a": bound_by(acc_a), "bound_by_b": bound_by(acc_b),
    }


# Below this share of A's time in kernel (or op) names B also ran, A and B are not the same
# workload: a V100 ResNet-50 against an H100 BERT shares almost none.
SAME_WORK_SHARE = 0.5


# Kernel names carry the dtype (bf16_s16816gemm, <c10::BFloat16>, sgemm): the same model
# at two precisions shares few of them. What launched them (aten::addmm, aten::layer_norm)
# does not change with the precision; where no CPU op is attributed, names without their
# template arguments and dtype tokens.
_DTYPE_TOKENS = re.compile(r"<[^<>]*>|\b(?:c10::)?(?:BFloat16|Half|float|double)\b|"
                           r"(?:bf16|fp16|f16|fp32|f32|tf32|fp8|e4m3|e5m2|[hsd](?=gemm))",
                           re.IGNORECASE)


def work_key(name: str) -> str:
    """A kernel or op name without what the precision changes."""
    previous = None
    while previous != name:  # nested template arguments: innermost first
        previous, name = name, _DTYPE_TOKENS.sub("", name)
    return re.sub(r"[_\s]+", "_", name).strip("_").lower()


def work_totals(parsed: ParsedTrace) -> dict[str, float]:
    """{dtype-free key: us}: the launching CPU op of each kernel group (its normalised name
    where none is attributed), or the CPU op's own name on a CPU trace."""
    totals: dict[str, float] = {}
    if parsed.is_gpu:
        for group in kernel_groups(parsed.table):
            key = group.cpu_op if group.cpu_op != UNATTRIBUTED_OP else work_key(group.name)
            totals[key] = totals.get(key, 0.0) + group.us
        return totals
    for name, entry in _name_totals(parsed).items():
        totals[work_key(name)] = totals.get(work_key(name), 0.0) + entry["us"]
    return totals


def shared_work_share(work_a: dict[str, float], work_b: dict[str, float]) -> float | None:
    """How much of their time A and B spent on the same work (work_totals), as the overlap
    of their time shares: sum over keys of min(share in A, share in B); 1.0 the same mix,
    0 nothing in common. Symmetric, and a precision change that makes the matrix work
    faster shifts the shares only so far."""
    total_a, total_b = sum(work_a.values()), sum(work_b.values())
    if total_a <= 0 or total_b <= 0:
        return None
    return sum(min(us / total_a, work_b[key] / total_b) for key, us in work_a.items()
               if key in work_b)


def what_differs(parsed_a: ParsedTrace, parsed_b: ParsedTrace,
                 shared: float | None) -> list[str]:
    """What two traces differ in, in the order a heading names them: the device, the
    precision of the matrix work, the work itself (`shared`: shared_work_share)."""
    differs = []
    device_a, device_b = parsed_a.table.attrs.get("device"), parsed_b.table.attrs.get("device")
    if device_a and device_b and device_a != device_b:
        differs.append(f"device ({device_a} vs {device_b})")
    dtype_a, dtype_b = _label(parsed_a, None, "?"), _label(parsed_b, None, "?")
    if "?" not in (dtype_a, dtype_b) and dtype_a != dtype_b:
        differs.append(f"precision ({dtype_a} vs {dtype_b})")
    if shared is not None and shared < SAME_WORK_SHARE:
        differs.append(f"the work (their time overlaps {shared * 100:.0f} % by what launched "
                       "it: different models, shapes or batch sizes)")
    return differs


def differs_words(diff: dict) -> str:
    """The "they differ in" line every surface prints before the ratios."""
    return "; ".join(diff.get("differs") or []) or "nothing the traces show but what is compared"


def config_differences(cfg_a, cfg_b) -> list[str]:
    """What two runs' configs differ in, as what_differs says it: model, batch, precision."""
    differs = []
    for name, a, b in (("model", cfg_a.model_label, cfg_b.model_label),
                       ("batch", cfg_a.batch_size, cfg_b.batch_size),
                       ("precision", cfg_a.precision, cfg_b.precision)):
        if a != b:
            differs.append(f"{name} ({a} vs {b})")
    return differs


def run_trace_path(store, run) -> Path | None:
    """The run's profiler trace in its directory, or None when it recorded none."""
    path = store.run_dir(run.id) / TRACE_FILENAME
    return path if path.exists() else None


def run_rank_traces(store, run) -> list[tuple[str, Path]]:
    """(label, path) of every rank's trace of a multi-process run, rank 0 first; empty
    when fewer than two ranks left one (a single-process run, profiling off)."""
    folder = store.run_dir(run.id)
    first = folder / TRACE_FILENAME
    others = [(f"rank-{rank}", folder / RANK_TRACE_PATTERN.format(rank=rank))
              for rank in range(1, int(getattr(run.config, "nprocs", 1) or 1))]
    found = [(label, path) for label, path in others if path.exists()]
    if not first.exists() or not found:
        return []
    return [("rank-0", first)] + found


def explain_runs(store, run_a, run_b) -> dict | None:
    """explain_diff for two runs' profiler windows (A = the baseline), labelled by the
    runs' labels; None when either has no trace; {"error": ...} when they cannot be
    compared (a GPU run against a CPU run)."""
    path_a, path_b = run_trace_path(store, run_a), run_trace_path(store, run_b)
    if path_a is None or path_b is None:
        return None
    try:
        diff = explain_diff(path_a, path_b, label_a=run_a.config.label,
                            label_b=run_b.config.label,
                            cpu_evidence_a=run_a.summary.get("cpu_evidence"),
                            cpu_evidence_b=run_b.summary.get("cpu_evidence"))
    except ValueError as exc:
        return {"error": str(exc).replace(str(store.home), "<data dir>")}
    diff["caveats"] = diff["caveats"] + run_caveats(diff, run_a.summary, run_b.summary)
    # the runs' configs say what the traces can only guess (model, batch, precision)
    known = config_differences(run_a.config, run_b.config)
    guessed = [d for d in diff["differs"] if not d.startswith(("the work", "precision"))]
    diff["differs"] = guessed + known
    if not any(d.startswith(("model", "batch")) for d in known):  # the same work, by config
        diff["caveats"] = [c for c in diff["caveats"] if c.get("key") != WORK_CAVEAT]
    return diff


def run_caveats(diff: dict, summary_a: dict, summary_b: dict) -> list[str]:
    """What a reader of two runs' window comparison must know: the figures are the few
    profiled steps, not the runs' steady-state throughput (and when the two disagree, by
    how much), and a run measured on a busy machine."""
    a, b = diff["label_a"], diff["label_b"]
    caveats = [_caveat(f"From the profiled steps only ({diff['steps_a']} of {a}, "
                       f"{diff['steps_b']} of {b}); the runs' throughput figures are medians "
                       "over their steady steps.", "note")]
    steady_a, steady_b = summary_a.get("step_time_ms"), summary_b.get("step_time_ms")
    window = diff.get("step_speedup")
    if steady_a and steady_b and window:
        steady = steady_a / steady_b
        if abs(window / steady - 1.0) > WINDOW_DISAGREES:
            caveats.append(_caveat(f"The steady steps say {ratio_text(steady)} "
                                   f"({step_time_text(steady_a, with_unit=False)} -> "
                                   f"{step_time_text(steady_b)} a step), not the window's "
                                   f"{ratio_text(window)}: the profiled steps do not represent the "
                                   "run; trust the steady figure."))
    for label, summary in ((a, summary_a), (b, summary_b)):
        contention = summary.get("contention") or {}
        if contention.get("busy"):
            words = contention.get("words") or "measured while the machine was busy"
            caveats.append(_caveat(f"{label}: {words}"))
    return caveats


def window_note(summary: dict) -> dict | None:
    """What a run's window verdict (summary["explain"]) covers, as a caveat: its profiled
    steps, and a warning when their step time is far from the run's steady median (a busy
    machine, a first-steps effect): the verdict then describes the window, not the run."""
    explain = summary.get("explain") or {}
    window_ms = (explain.get("step_time_us") or 0.0) / 1000.0
    steps = ((explain.get("accounting") or {}).get("window") or {}).get("step_count")
    if not window_ms:
        return None
    text = f"From the {steps or 'few'} profiled step(s), {step_time_text(window_ms)} each"
    steady_ms = summary.get("step_time_ms")
    if steady_ms and abs(window_ms / steady_ms - 1.0) > WINDOW_DISAGREES:
        return _caveat(
            f"{text}; the run's steady steps took {step_time_text(steady_ms)}: the verdict "
            "describes the profiled window, not the run (profile again on a quiet "
            "machine)."
        )
    return _caveat(f"{text}.", "note")


WORK_CAVEAT = "different_work"


def _caveat(text: str, severity: str = "warning", key: str | None = None) -> dict:
    """{"text", "severity"}: "warning" changes what the figures mean, "note" frames them;
    `key` names a caveat a caller may replace with better knowledge."""
    return {"text": text, "severity": severity, **({"key": key} if key else {})}


def only_in_rows(rows: list[dict]) -> list[dict]:
    """explain_diff's only_in_a/only_in_b as table rows (short names, ms per step)."""
    return [{"kernel or op": short_kernel_name(row["name"]),
             "ms_per_step": round(row["us_per_step"] / 1000, 3), "count": row["count"],
             "note": row["note"] or "", "full name": row["name"]} for row in rows]


def parts_rows(diff: dict) -> list[dict]:
    """explain_diff's parts as table rows (ms per step, share of A's step, speedup)."""
    rows = []
    for part in diff["parts"]:
        if not part["a_us"] and not part["b_us"]:
            continue
        rows.append({"part": part["part"],
                     f"{diff['label_a']} (ms/step)": round(part["a_us"] / 1000, 3),
                     f"{diff['label_b']} (ms/step)": round(part["b_us"] / 1000, 3),
                     "share of A's step": share_text(part["share_of_a"], 1),
                     "speedup": ratio_text(part["speedup"])})
    rows.append({"part": "step",
                 f"{diff['label_a']} (ms/step)": round(diff["step_time_a_us"] / 1000, 3),
                 f"{diff['label_b']} (ms/step)": round(diff["step_time_b_us"] / 1000, 3),
                 "share of A's step": "100.0 %",
                 "speedup": ratio_text(diff["step_speedup"])})
    return rows
