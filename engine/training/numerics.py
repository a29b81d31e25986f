"""Numerics: how gradient and activation magnitudes sit against the fp16 and bf16 ranges.

Two layers:
  - pure functions on one tensor: `log2_histogram` (counts per power-of-two bucket of
    |x|) and `fp16_fractions` (what share of the values would round to zero, become
    subnormal or overflow if stored in fp16, with and without a loss scale);
  - `NumericsProbe`, which the training loop arms on a few sampled steps only. Its hooks
    compute those statistics with torch ops on the training device and keep them there;
    one transfer to the host per sampled step (in `capture_gradients`). On other steps
    the hooks return after one attribute check.

"Would underflow" follows fp16's rounding (round to nearest even) exactly, not a loose
threshold: |x| <= 2**-25 (half the smallest subnormal, ~3.0e-8) rounds to 0, values
up to 2**-14 (6.1e-5) become subnormal (fewer significant bits), |x| >= 65520 rounds
to inf. bf16 shares fp32's exponent range, so bf16 underflow needs |x| < ~1e-38.

What the probe sees, per kind of record (all statistics are of the *true*, unscaled
value v; the `_scaled` fractions are for v * loss_scale, what a GradScaler would store):
  - "activation": a Linear/Conv layer's output in the forward pass, in the dtype it was
    computed in (fp16/bf16 under autocast). The loss scale does not apply: no
    `_scaled` fractions.
  - "output_grad": the gradient with respect to that output, seen during backward.
    Under fp16-amp with a GradScaler it arrives multiplied by the loss scale (and
    already rounded to fp16 there); the probe divides by the scale given to
    `begin_step` (a power of two, so exactly). Values that already underflowed in the
    fp16 backward arrive as exact zeros: look at `zero_frac`, not `underflow_frac_fp16`,
    for a run that trained in fp16.
  - "grad": the layer's weight gradient (`weight.grad`, fp32 for autocast modes, bf16
    for bf16-pure) when `capture_gradients` is called. Call it after
    `scaler.unscale_(optimizer)` (the default `grads_scaled=False`); before unscale_
    the grads are still multiplied by the scale: pass `grads_scaled=True`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:  # torch is imported where it is used: the UI reads records without it
    import torch
    from torch import nn

from engine.analysis.numerics import FILE_FORMAT, FILE_VERSION, KINDS

# Buckets of floor(log2 |x|) for every finite nonzero float32: 2**-149 .. 2**127.
_MIN_EXPONENT, _MAX_EXPONENT = -149, 127
_N_BUCKETS = _MAX_EXPONENT - _MIN_EXPONENT + 1
# Layout of the per-tensor statistics vector after the histogram buckets.
_SCALARS = ("zero", "nonfinite", "total",
            "underflow_fp16", "subnormal_fp16", "overflow_fp16",
            "underflow_fp16_scaled", "subnormal_fp16_scaled", "overflow_fp16_scaled",
            "underflow_bf16")
_SLOT = {name: _N_BUCKETS + index for index, name in enumerate(_SCALARS)}
_VECTOR_LEN = _N_BUCKETS + len(_SCALARS)


# ---------------------------------------------------------------------------------------
# one tensor


def _stats_vector(values: "torch.Tensor", seen_scale: float = 1.0,
                  loss_scale: float | None = 1.0) -> "torch.Tensor":
    """All statistics of one tensor as one int64 vector on the tensor's device (no sync).

    `values / seen_scale` is the true value v; the `_scaled` slots describe
    v * loss_scale (left at 0 when loss_scale is None).
    """
    import torch

    true = values.detach().float()  # exact for fp16/bf16 inputs
    if seen_scale and seen_scale != 1.0:
        true = true / seen_scale  # power-of-two scales divide exactly
    true = true.reshape(-1)
    magnitude = true.abs()
    finite = torch.isfinite(true)
    nonzero = finite & (magnitude > 0)
    # frexp: |x| = m * 2**e with m in [0.5, 1), so floor(log2 |x|) = e - 1. Rows that are
    # zero or non-finite go to a spare bucket that is dropped: no data-dependent shapes,
    # hence no device-host sync.
    exponent = torch.frexp(torch.where(nonzero, magnitude, torch.ones_like(magnitude)))[1]
    bucket = torch.where(nonzero, exponent.long() - 1 - _MIN_EXPONENT,
                         torch.full_like(exponent, _N_BUCKETS, dtype=torch.long))
    hist = torch.zeros(_N_BUCKETS + 1, dtype=torch.long, device=true.device)
    hist.scatter_add_(0, bucket, torch.ones_like(bucket))
    scalars = {
        "zero": (finite & ~nonzero).sum(),
        "nonfinite": (~finite).sum(),
        # torch.full, not torch.tensor: a fill on the device, no host-to-device copy.
        "total": torch.full((), true.numel(), dtype=torch.long, device=true.device),
        "underflow_bf16": (nonzero & (magnitude <= BF16_ZERO_AT_OR_BELOW)).sum(),
    }
    scalars.update(_fp16_counts(magnitude, nonzero, 1.0, ""))
    if loss_scale:  # None: not applicable (activations); a collapsed 0 scale: no answer
        scalars.update(_fp16_counts(magnitude, nonzero, loss_scale, "_scaled"))
    tail = torch.stack([scalars.get(name, torch.zeros((), dtype=torch.long, device=true.device))
                        .to(torch.long) for name in _SCALARS])
    return torch.cat([hist[:_N_BUCKETS], tail])


# Where fp16's round-to-nearest-even lands, as exact float32 thresholds on |x|:
# |x| <= 2**-25 (half the smallest subnormal; the tie goes to the even 0) becomes 0;
# |x| >= 2**-14 - 2**-25 rounds up to the smallest normal; |x| >= 65520 (halfway to
# 2**16) becomes inf. bf16 has subnormals down to 2**-133, so 0 at or below 2**-134.
FP16_ZERO_AT_OR_BELOW = 2.0 ** -25
FP16_NORMAL_FROM = 2.0 ** -14 - 2.0 ** -25
FP16_INF_FROM = 65520.0
BF16_ZERO_AT_OR_BELOW = 2.0 ** -134


def _fp16_counts(magnitude: "torch.Tensor", nonzero: "torch.Tensor", scale: float,
                 suffix: str) -> dict[str, "torch.Tensor"]:
    """What a cast of |x| * scale to fp16 would do, counted without materialising the
    cast: comparing |x| with threshold / scale is exact for power-of-two scales (every
    GradScaler scale is one). Only values that were finite and nonzero count."""
    underflow = nonzero & (magnitude <= FP16_ZERO_AT_OR_BELOW / scale)
    below_normal = magnitude < FP16_NORMAL_FROM / scale
    return {
        f"underflow_fp16{suffix}": underflow.sum(),
        f"subnormal_fp16{suffix}": (nonzero & below_normal & ~underflow).sum(),
        # inf and NaN are not "finite and nonzero": magnitude comparisons exclude NaN,
        # and nonzero excludes inf.
        f"overflow_fp16{suffix}": (nonzero & (magnitude >= FP16_INF_FROM / scale)).sum(),
    }


def _hist_from_vector(vector: list[int]) -> dict[str, Any]:
    exponents = [i + _MIN_EXPONENT for i in range(_N_BUCKETS) if vector[i]]
    return {
        "exponents": exponents,  # bucket e holds |x| in [2**e, 2**(e+1))
        "counts": [vector[e - _MIN_EXPONENT] for e in exponents],
        "zero": vector[_SLOT["zero"]],
        "nonfinite": vector[_SLOT["nonfinite"]],
        "total": vector[_SLOT["total"]],
    }


def _fractions_from_vector(vector: list[int], with_scale: bool) -> dict[str, float | None]:
    total = vector[_SLOT["total"]] or 1

    def share(name: str) -> float:
        return vector[_SLOT[name]] / total

    fractions: dict[str, float | None] = {
        "zero_frac": share("zero"),
        "nonfinite_frac": share("nonfinite"),
        "underflow_frac_fp16": share("underflow_fp16"),
        "subnormal_frac_fp16": share("subnormal_fp16"),
        "overflow_frac_fp16": share("overflow_fp16"),
        "underflow_frac_bf16": share("underflow_bf16"),
    }
    for name in ("underflow", "subnormal", "overflow"):
        fractions[f"{name}_frac_fp16_scaled"] = (share(f"{name}_fp16_scaled")
                                                 if with_scale else None)
    return fractions


def log2_histogram(tensor: "torch.Tensor") -> dict[str, Any]:
    """Counts of |x| per power-of-two bucket for finite nonzero x, plus zero/nonfinite.

    {"exponents": [e, ...], "counts": [n, ...], "zero": n, "nonfinite": n, "total": n};
    bucket e holds 2**e <= |x| < 2**(e+1); empty buckets are left out.
    """
    return _hist_from_vector(_stats_vector(tensor, loss_scale=None).cpu().tolist())


def fp16_fractions(tensor: "torch.Tensor", loss_scale: float = 1.0) -> dict[str, float | None]:
    """Share of all elements that fp16 would round to zero / make subnormal / overflow.

    `*_fp16` fractions are for the values as given, `*_fp16_scaled` for values times
    `loss_scale`; `underflow_frac_bf16` for a cast to bf16. Values that are already
    zero or non-finite never count as underflow (see `zero_frac`, `nonfinite_frac`).
    """
    vector = _stats_vector(tensor, loss_scale=float(loss_scale)).cpu().tolist()
    return {**_fractions_from_vector(vector, with_scale=True), "loss_scale": float(loss_scale)}


# ---------------------------------------------------------------------------------------
# the probe


def matrix_layers(model: "nn.Module") -> list[tuple[str, "nn.Module"]]:
    """(name, module) of every Linear/Conv layer; torch.compile's prefix removed so the
    names match between a compiled model and the module it wraps."""
    from torch import nn

    layer_types = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
    return [(name.removeprefix("_orig_mod."), module) for name, module in model.named_modules()
            if isinstance(module, layer_types)]


def default_sample_steps(total_steps: int, count: int = 3) -> list[int]:
    """The first step (the initialisation), then evenly spaced up to the last step."""
    if total_steps <= count:
        return list(range(1, total_steps + 1))
    picks = {1, total_steps}
    for index in range(1, count - 1):
        picks.add(round(1 + index * (total_steps - 1) / (count - 1)))
    return sorted(picks)


class NumericsProbe:
    """Per-layer magnitude statistics at a few sampled steps. Usage in a training step:

        probe = NumericsProbe({1, 30, 60}).register(model)      # once
        if probe.wants(step):
            probe.begin_step(step, loss_scale=scaler.get_scale() if scaler else 1.0)
        ... forward, backward, scaler.unscale_(optimizer) ...
        if probe.wants(step):
            probe.capture_gradients(step, model)                # the one host transfer
            probe.save(run_dir / NUMERICS_FILENAME)
    """

    def __init__(self, sample_steps: Iterable[int]):
        self.sample_steps = frozenset(int(step) for step in sample_steps)
        self._handles: list[Any] = []
        self._layers: list[tuple[str, "nn.Module"]] = []
        self._active_step: int | None = None
        self._loss_scale = 1.0
        # (layer, kind) -> [stats vector on the device, dtype name, loss_scale or None]
        self._pending: dict[tuple[str, str], list[Any]] = {}
        self._records: dict[tuple[int, str, str], dict[str, Any]] = {}

    # -- arming -------------------------------------------------------------------------
    def wants(self, step: int) -> bool:
        return step in self.sample_steps

    def register(self, model: "nn.Module") -> "NumericsProbe":
        """Forward hooks on every Linear/Conv layer; they do nothing unless armed."""
        for name, module in matrix_layers(model):
            self._layers.append((name, module))
            self._handles.append(module.register_forward_hook(self._forward_hook(name)))
        return self

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def begin_step(self, step: int, loss_scale: float = 1.0) -> bool:
        """Arm the hooks for `step` if it is sampled. `loss_scale`: the scale the coming
        backward multiplies gradients by (GradScaler.get_scale(); 1.0 without a scaler)."""
        self._pending = {}
        if not self.wants(step):
            self._active_step = None
            return False
        self._active_step = step
        self._loss_scale = float(loss_scale)
        return True

    # -- hooks --------------------------------------------------------------------------
    def _forward_hook(self, layer: str):
        import torch

        def hook(_module: "nn.Module", _inputs: Any, output: Any) -> None:
            if self._active_step is None or not isinstance(output, torch.Tensor):
                return  # the common case: one attribute check per layer per step
            self._add(layer, "activation", _stats_vector(output, loss_scale=None),
                      output.dtype, None)
            if output.requires_grad:
                # A tensor hook on this step's output only: no cost on other steps.
                output.register_hook(self._output_grad_hook(layer))
        return hook

    def _output_grad_hook(self, layer: str):
        def hook(grad: "torch.Tensor") -> None:
            if self._active_step is not None:
                scale = self._loss_scale
                self._add(layer, "output_grad",
                          _stats_vector(grad, seen_scale=scale, loss_scale=scale),
                          grad.dtype, scale)
            # returns None: the gradient flows on unchanged
        return hook

    def _add(self, layer: str, kind: str, vector: "torch.Tensor", dtype: "torch.dtype",
             loss_scale: float | None) -> None:
        key = (layer, kind)
        if key in self._pending:  # a layer used twice in one step: counts add up
            self._pending[key][0] = self._pending[key][0] + vector
        else:
            self._pending[key] = [vector, str(dtype).removeprefix("torch."), loss_scale]

    # -- collecting ---------------------------------------------------------------------
    def capture_gradients(self, step: int, model: "nn.Module | None" = None,
                          loss_scale: float | None = None, grads_scaled: bool = False) -> None:
        """Record weight gradients and finish `step`: one device-to-host transfer.

        Call after backward and before `optimizer.zero_grad()`. `loss_scale` defaults to
        the one given to `begin_step`; `grads_scaled=True` when `.grad` still holds the
        scaled gradients (before `scaler.unscale_`).
        """
        if not self.wants(step):
            return
        scale = self._loss_scale if loss_scale is None else float(loss_scale)
        layers = matrix_layers(model) if model is not None else self._layers
        for name, module in layers:
            grad = getattr(getattr(module, "weight", None), "grad", None)
            if grad is not None:
                self._add(name, "grad", _stats_vector(grad, seen_scale=scale if grads_scaled
                                                      else 1.0, loss_scale=scale),
                          grad.dtype, scale)
        self._flush(step)

    def _flush(self, step: int) -> None:
        if self._pending:
            import torch

            keys = list(self._pending)
            # The one sync of a sampled step: every layer's statistics in one transfer.
            table = torch.stack([self._pending[key][0] for key in keys]).cpu().tolist()
            for (layer, kind), vector in zip(keys, table):
                _vector, dtype, loss_scale = self._pending[(layer, kind)]
                self._records[(step, layer, kind)] = _record(step, layer, kind, dtype,
                                                             loss_scale, vector)
        self._pending = {}
        self._active_step = None

    def records(self) -> list[dict[str, Any]]:
        """One dict per (step, layer, kind), in step order, layers in model order."""
        order = {name: index for index, (name, _module) in enumerate(self._layers)}
        return sorted(self._records.values(),
                      key=lambda r: (r["step"], order.get(r["layer"], len(order)), r["layer"],
                                     KINDS.index(r["kind"])))

    def save(self, path: str | os.PathLike) -> Path:
        """Write the records as JSON, atomically (a reader never sees half a file)."""
        path = Path(path)
        payload = {"format": FILE_FORMAT, "version": FILE_VERSION,
                   "sample_steps": sorted(self.sample_steps), "records": self.records()}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(payload))
        os.replace(tmp, path)
        return path


def _record(step: int, layer: str, kind: str, dtype: str, loss_scale: float | None,
            vector: list[int]) -> dict[str, Any]:
    return {"step": step, "layer": layer, "kind": kind, "dtype": dtype,
            "numel": vector[_SLOT["total"]], "loss_scale": loss_scale,
            "hist": _hist_from_vector(vector),
            **_fractions_from_vector(vector, with_scale=loss_scale is not None)}
