"""The skipped-step ledger (fp16-amp with a GradScaler): for every step the scaler skipped,
the step, the loss scale before and after, where the non-finite gradients were (the layers,
and the parameters by their named_parameters() names) and each layer's largest gradient
before unscaling.

GradScaler skips a step when a gradient holds inf or NaN and halves its scale; the run's
figures only count the skips. This says which layer overflowed. Cost: the loop reads the
gradient norm's finiteness on every scaler step, just before `scaler.step`, which reads
its own found-inf flag at that point anyway (a host sync on CUDA); the per-layer pass over
the gradients runs on skipped steps only.

Layers are the modules that own parameters, in the model's registration order (input
first for the usual Sequential and transformer stacks; a model that registers its modules
in another order than it calls them shifts `origin` with it). The overflow starts at the
non-finite layer nearest the loss (backward runs from the loss to the input and carries
inf/NaN downwards): `origin` names it. Per entry every non-finite layer comes first
(nearest the loss first), then the largest finite ones, MAX_LAYERS_SHOWN in all.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

MAX_ENTRIES = 50        # a run that skips every step keeps the first ones in full
MAX_LAYERS_SHOWN = 40   # per entry: every non-finite layer, then the largest finite ones


class SkipLedger:
    def __init__(self, model: nn.Module):
        # (name, own parameters by their full names) of every module that holds some, in
        # the model's order: "1.weight", as model.named_parameters() names it
        self.layers = [(name or type(module).__name__,
                        [(f"{name}.{local}" if name else local, param)
                         for local, param in module.named_parameters(recurse=False)])
                       for name, module in model.named_modules()
                       if any(True for _ in module.parameters(recurse=False))]
        self.entries: list[dict[str, Any]] = []
        self.skipped = 0

    def before_step(self, step: int, scale: float, loss: torch.Tensor) -> dict[str, Any] | None:
        """A skipped step's entry, taken while its gradients are still there (unscaled by
        `scaler.unscale_`; `scale` turns them back into what the backward produced)."""
        self.skipped += 1
        if len(self.entries) >= MAX_ENTRIES:
            return None
        layers = [_layer_record(name, params, scale) for name, params in self.layers]
        nonfinite = [layer["layer"] for layer in layers if layer["nonfinite"]]
        finite = sorted((layer for layer in layers if not layer["nonfinite"]),
                        key=lambda layer: -(layer["max_abs_grad_scaled"] or 0.0))
        shown = [layer for layer in layers if layer["nonfinite"]][::-1] + finite
        entry = {
            "step": step, "scale_before": scale, "scale_after": None,
            "loss_finite": bool(torch.isfinite(loss).all()),
            "origin": nonfinite[-1] if nonfinite else None,
            # the origin layer's parameters whose gradients held inf/NaN
            "origin_parameters": next((layer["nonfinite_parameters"] for layer in layers
                                       if nonfinite and layer["layer"] == nonfinite[-1]), []),
            "nonfinite_layers": nonfinite[-MAX_LAYERS_SHOWN:][::-1],  # nearest the loss first
            "nonfinite_layer_count": len(nonfinite),
            "layers": shown[:MAX_LAYERS_SHOWN], "layer_count": len(layers),
        }
        self.entries.append(entry)
        return entry

    @staticmethod
    def after_step(entry: dict[str, Any] | None, scale: float) -> None:
        if entry is not None:
            entry["scale_after"] = scale

    def summary(self) -> dict[str, Any]:
        return {"entries": self.entries, "entries_total": self.skipped,
                "entries_kept": len(self.entries), "max_entries": MAX_ENTRIES}


def _layer_record(name: str, params: list[tuple[str, torch.Tensor]], scale: float
                  ) -> dict[str, Any]:
    grads = [(full, p.grad) for full, p in params if p.grad is not None]
    if not grads:
        return {"layer": name, "nonfinite": False, "max_abs_grad_scaled": None,
                "nonfinite_params": 0, "nonfinite_parameters": []}
    nonfinite = [full for full, g in grads if not bool(torch.isfinite(g).all())]
    # the largest finite value: a non-finite layer says how large the rest of it was
    largest = max(float(g.detach().abs().float().nan_to_num(nan=0.0, posinf=0.0).max())
                  for _full, g in grads)
    scaled = largest * scale
    return {"layer": name, "nonfinite": bool(nonfinite),
            "max_abs_grad_scaled": scaled if math.isfinite(scaled) else None,
            "nonfinite_params": len(nonfinite), "nonfinite_parameters": nonfinite}
