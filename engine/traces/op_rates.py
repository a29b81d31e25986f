"""Per-op FLOPs, bytes and achieved rates from a trace's recorded shapes, and the
arithmetic as a second witness to the name-based Tensor-Core verdict.

An op's rate is its FLOPs (engine.traces.op_flops, from `Input Dims`) over the summed time
of the GPU kernels it launched (the runtime calls inside its CPU span, joined to their
kernels by correlation id). On a trace without GPU kernels (a CPU run) the op's own CPU
time is the denominator. Ops nest (aten::linear -> aten::addmm): each call is rated at the
innermost op of op_flops.SHAPED_OPS, so no FLOP is counted twice.

The witness: a matrix op that ran faster than the device's vector units can go in its dtype
(hardware.gpus.GpuSpec.vector_ceiling) used the matrix units, whatever its kernels are named.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

from engine.hardware.gpus import GpuSpec, gpu_spec
from engine.traces.op_flops import OpCost, op_cost
from engine.traces.parser import ParsedTrace

RECORD_SHAPES_HINT = ("the trace has no input shapes: profile with "
                      "torch.profiler.profile(..., record_shapes=True) to get per-op FLOPs "
                      "and rates")
# A rate past the vector ceiling by less than this is within the clocks' reach (boost,
# a ceiling rounded down): not evidence.
WITNESS_MARGIN = 1.05


@dataclass
class _Group:
    op: str
    shape: str
    dtype: str
    kind: str
    cost: OpCost
    calls: int = 0
    time_us: float = 0.0
    call_us: list = field(default_factory=list)  # each call's time: the per-call rates
    kernel_us_by_verdict: dict = field(default_factory=lambda: defaultdict(float))
    kernel_us_by_dtype: dict = field(default_factory=lambda: defaultdict(float))
    input_dims: tuple = ()


def _innermost(shaped_ops: list) -> list:
    """The shaped ops that hold no other shaped op (per thread): aten::addmm, not the
    aten::linear around it."""
    by_thread: dict[tuple, list] = defaultdict(list)
    for op in shaped_ops:
        by_thread[(op[3], op[4])].append(op)
    kept = []
    for ops in by_thread.values():
        ops.sort(key=lambda op: (op[1], -op[2]))
        has_child = [False] * len(ops)
        stack: list[int] = []
        for index, op in enumerate(ops):
            while stack and ops[stack[-1]][2] <= op[1]:
                stack.pop()
            if stack and op[2] <= ops[stack[-1]][2]:
                has_child[stack[-1]] = True
            stack.append(index)
        kept += [op for index, op in enumerate(ops) if not has_child[index]]
    return kept


def _kernels_by_correlation(trace: ParsedTrace, wanted: set) -> dict:
    """correlation -> [(dur_us, tensor_core, dtype, category)] of the GPU kernels and
    copy-engine events launched under the `wanted` correlations (the shaped ops' launches:
    a few percent of a big trace's kernels, so the other columns are read for those rows
    alone)."""
    table = trace.table
    if table.empty or not wanted:
        return {}
    rows = [index for index, correlation in enumerate(table["correlation"])
            if correlation in wanted]
    columns = [table[name] for name in ("correlation", "dur_us", "tensor_core", "dtype",
                                        "category")]
    found: dict = defaultdict(list)
    for index in rows:
        correlation, dur, tensor_core, dtype, category = (column[index] for column in columns)
        found[correlation].append((dur, tensor_core, dtype, category))
    # the memsets and copies an op launched (cuBLAS clears its split-K workspace) are part
    # of its GPU time, as TraceLens counts them
    for copy in trace.copies:
        if copy[7] is not None and copy[7] in wanted:
            found[copy[7]].append((copy[2], "no", None, "memcpy/memset"))
    return found


def _launches_by_thread(trace: ParsedTrace, threads: set) -> dict:
    """(pid, tid) -> (sorted start times, correlations) of the runtime calls made on the
    `threads` (those of the shaped ops: one or a few), one list comprehension per thread:
    a 1 GiB trace holds 400k launches."""
    result = {}
    launches = trace.launches
    for pid, tid in threads:
        mine = [launch for launch in launches
                if launch[4] == tid and launch[3] == pid and launch[0] is not None]
        starts = [launch[2] for launch in mine]
        correlations = [launch[0] for launch in mine]
        if any(later < earlier for earlier, later in zip(starts, starts[1:])):
            order = sorted(range(len(starts)), key=starts.__getitem__)  # stable: ties kept
            starts = [starts[index] for index in order]
            correlations = [correlations[index] for index in order]
        result[(pid, tid)] = (starts, correlations)
    return result


def _group_calls(trace: ParsedTrace) -> dict:
    gpu = not trace.table.empty
    innermost = _innermost(trace.shaped_ops)
    launches = _launches_by_thread(trace, {(op[3], op[4]) for op in innermost}) if gpu else {}
    groups: dict[tuple, _Group] = {}
    launched_by: list[tuple[_Group, list]] = []  # each GPU call: its group, its launches
    for op in innermost:
        name, ts, end, pid, tid, _external, dims, types, concrete = op
        cost = op_cost(name, dims, types, concrete)
        if cost is None:
            continue
        key = (name, cost.shape, cost.dtype)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(name, cost.shape, cost.dtype, cost.kind, cost,
                                         input_dims=dims)
        if not gpu:
            group.calls += 1
            group.time_us += end - ts
            group.call_us.append(end - ts)
            continue
        starts, correlations = launches.get((pid, tid), ([], []))
        first, last = bisect.bisect_left(starts, ts), bisect.bisect_right(starts, end)
        launched_by.append((group, correlations[first:last]))
    kernels = _kernels_by_correlation(
        trace, {correlation for _group, launched in launched_by for correlation in launched})
    for group, correlations in launched_by:
        launched = [k for c in correlations for k in kernels.get(c, ())]
        if not launched:
            continue  # the op launched nothing inside the window (or its kernels fell out)
        group.calls += 1
        group.call_us.append(sum(k[0] for k in launched))
        for dur, tensor_core, dtype, category in launched:
            group.time_us += dur
            if category in ("gemm", "conv", "attention"):
                group.kernel_us_by_verdict[tensor_core] += dur
                if dtype:
                    group.kernel_us_by_dtype[dtype] += dur
    return {key: group for key, group in groups.items() if group.calls and group.time_us > 0}


def _largest(weights: dict) -> str | None:
    return max(weights, key=weights.get) if weights else None


def _row(group: _Group, spec: GpuSpec | None, gpu: bool) -> dict:
    # The mean of the calls' rates, as TraceLens reports TFLOPS/s; the overall rate (all
    # FLOPs over all the time) beside it weighs a slow call by its time.
    timed = [us for us in group.call_us if us > 0]
    tflops = sum(group.cost.flops / us for us in timed) / len(timed) / 1e6
    tb_per_s = sum(group.cost.bytes / us for us in timed) / len(timed) / 1e6
    overall_tflops = group.cost.flops * group.calls / group.time_us / 1e6
    compute_dtype = _largest(group.kernel_us_by_dtype) or group.dtype
    peak = spec.matrix_peak(compute_dtype) if spec else None
    peak_kind = "matrix"
    if peak is None and spec is not None:
        peak, peak_kind = spec.vector_ceiling(compute_dtype), "vector"
    ceiling = spec.vector_ceiling(compute_dtype) if spec else None
    flop_per_byte = group.cost.flops / group.cost.bytes if group.cost.bytes else None
    bound = None
    if spec and peak and flop_per_byte is not None:
        ridge = peak / spec.memory_tb_per_s  # FLOP per byte where the roofline bends
        bound = "compute" if flop_per_byte >= ridge else "memory"
    name_verdict = _largest(group.kernel_us_by_verdict)
    return {
        "op": group.op, "kind": group.kind, "shape": group.shape, "dtype": group.dtype,
        "input_dims": [list(dim) for dim in group.input_dims],
        "compute_dtype": compute_dtype, "calls": group.calls,
        "flops_per_call": group.cost.flops, "bytes_per_call": group.cost.bytes,
        "kernel_us": round(group.time_us, 3), "time_basis": "gpu kernels" if gpu else "cpu op",
        "tflops_per_s": tflops, "tflops_per_s_overall": overall_tflops, "tb_per_s": tb_per_s,
        "flop_per_byte": flop_per_byte,
        "peak_tflops": peak, "peak_kind": peak_kind if peak else None,
        "share_of_peak": tflops / peak if peak else None,
        "vector_ceiling_tflops": ceiling,
        "above_vector_ceiling": (tflops > ceiling * WITNESS_MARGIN) if ceiling else None,
        "bound": bound, "name_verdict": name_verdict,
    }


def op_rates(trace: ParsedTrace, device_name: str | None = None) -> list[dict]:
    """One row per (op, shape, dtype), most kernel time first. Empty when the trace
    recorded no shapes (see RECORD_SHAPES_HINT) or rated no op."""
    gpu = not trace.table.empty
    device = device_name or (trace.table.attrs.get("device") if gpu else None)
    spec = gpu_spec(device) if gpu else None
    rows = [_row(group, spec, gpu) for group in _group_calls(trace).values()]
    rows.sort(key=lambda row: -row["kernel_us"])
    return rows


def rate_witness(rows: list[dict], name_verdict: str | None, device: str | None) -> dict:
    """Whether the rates confirm, contradict or cannot decide the name-based call.

    - confirms: an op whose kernels' names say matrix units ran above the vector ceiling;
    - contradicts: an op whose kernels' names say no matrix units ran above it (the names
      are wrong: the arithmetic cannot be done that fast without them);
    - cannot decide: no op ran above its ceiling (slow matrix kernels exist: a rate below
      the ceiling proves nothing), the device's ceilings are unknown, or no shapes.
    """
    if not rows:
        return {"witness": "cannot decide", "op": None,
                "why": "no op with recorded shapes ran a kernel: " + RECORD_SHAPES_HINT}
    if all(row["vector_ceiling_tflops"] is None for row in rows):
        return {"witness": "cannot decide", "op": None,
                "why": f"the vector-unit ceilings of {device or 'this device'} are not in the "
                       "GPU catalogue"}
    above = [row for row in rows if row["above_vector_ceiling"]]
    against = [row for row in above if row["name_verdict"] == "no"]
    if against:
        row = max(against, key=lambda r: r["kernel_us"])
        return {"witness": "contradicts", "op": _op_words(row),
                "why": f"{_op_words(row)} ran at {row['tflops_per_s']:.1f} TFLOP/s, above the "
                       f"{row['vector_ceiling_tflops']:g} TFLOP/s its {row['compute_dtype']} "
                       "vector units can reach, yet its kernels' names say they did not use "
                       "the matrix units"}
    if above:
        row = max(above, key=lambda r: r["tflops_per_s"] / r["vector_ceiling_tflops"])
        words = ("confirms" if name_verdict in ("yes", "partly") else "decides")
        return {"witness": words, "op": _op_words(row),
                "why": f"{_op_words(row)} ran at {row['tflops_per_s']:.1f} TFLOP/s, "
                       f"{row['tflops_per_s'] / row['vector_ceiling_tflops']:.1f}x the "
                       f"{row['vector_ceiling_tflops']:g} TFLOP/s its {row['compute_dtype']} "
                       "vector units can reach: only the matrix units go that fast"}
    fastest = max(rows, key=lambda r: r["tflops_per_s"])
    return {"witness": "cannot decide", "op": _op_words(fastest),
            "why": f"no op ran above its vector-unit ceiling (fastest: {_op_words(fastest)} at "
                   f"{fastest['tflops_per_s']:.2f} TFLOP/s): too small or too slow to tell"}


WITNESS_WORDS = {"confirms": "The rates confirm the kernel names",
                 "decides": "The rates decide where the names say nothing",
                 "contradicts": "The rates contradict the kernel names",
                 "cannot decide": "The rates cannot decide"}


def witness_sentence(witness: dict) -> str:
    """The witness as one sentence, for every surface (CLI, Kernels page)."""
    return f"{WITNESS_WORDS.get(witness['witness'], witness['witness'])}: {witness['why']}"


def _op_words(row: dict) -> str:
    return f"{row['op']} {row['shape']} {row['dtype']}"



def op_rates_summary(trace: ParsedTrace, name_verdict: str | None) -> dict:
    """{"op_rates": rows, "rate_witness": {...}, "op_rates_note": text or None}: what
    `engine kernels --json` carries and the Kernels page draws."""
    rows = op_rates(trace)
    device = trace.table.attrs.get("device") if not trace.table.empty else None
    note = None
    if not trace.shaped_ops:
        note = RECORD_SHAPES_HINT
    elif not rows:
        note = "no op with recorded shapes has a FLOP formula here or launched a kernel"
    witness = rate_witness(rows, name_verdict, device) if not trace.table.empty else None
    spec = gpu_spec(device)
    device_spec = None if spec is None else {
        "row": spec.row, "memory_tb_per_s": spec.memory_tb_per_s,
        "matrix_tflops": dict(spec.matrix_tflops), "vector_tflops": dict(spec.vector_tflops),
        "source": spec.source}
    return {"op_rates": rows, "rate_witness": witness, "op_rates_note": note,
            "device_spec": device_spec}
