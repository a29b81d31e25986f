"""Will fp8 pay for this model? The forward GEMM shapes of its nn.Linear layers (the only
layers torchao converts) against the size below which torchao's own benchmarks show fp8
losing to bf16. Asked at launch (the Launch page, `run`), and stored with an fp8 run's
summary as `fp8_advice` and `gemm_shapes`.
"""

from __future__ import annotations

from engine.config import ModelName, Precision, RunConfig

FP8_MIN_GEMM_DIM = 2048  # torchao's float8 benchmarks: below ~2048-4096 per dim fp8 loses


def linear_gemm_shapes(cfg: RunConfig) -> list[tuple[str, int, int, int]]:
    """(layer, M, K, N) of the forward GEMMs of the model's nn.Linear layers: the only
    layers torchao converts to fp8 (convolutions stay in bf16)."""
    # imports torch: the session, the supervisor and the Launch page import this module
    from engine.training.models import model_spec

    spec = model_spec(cfg)
    if cfg.model == ModelName.GPT.value:
        tokens, d = cfg.batch_size * cfg.seq_len, spec.d_model
        return [("attn.qkv", tokens, d, 3 * d), ("attn.proj", tokens, d, d),
                ("mlp.fc", tokens, d, 4 * d), ("mlp.proj", tokens, 4 * d, d),
                ("lm_head", tokens, d, spec.vocab_size)]
    if cfg.model == ModelName.MLP.value:
        shapes, width_in = [], spec.input_dim
        for index in range(spec.depth - 1):
            shapes.append((f"net.{2 * index}", cfg.batch_size, width_in, spec.hidden_dim))
            width_in = spec.hidden_dim
        shapes.append(("head", cfg.batch_size, width_in, spec.num_classes))
        return shapes
    return [("head", cfg.batch_size, spec.widths[-1], spec.num_classes)]


def fp8_advice(cfg: RunConfig) -> str | None:
    """A sentence for the user when fp8 will not pay for this model; None when it may
    (or when the run is not fp8)."""
    if cfg.precision != Precision.FP8.value:
        return None
    if cfg.model not in (ModelName.MLP.value, ModelName.RESNET.value, ModelName.GPT.value):
        return None  # known architectures, custom workloads: no layer-shape model here
    compile_hint = ("" if cfg.compile else " Also turn on compile: torchao's fp8 casts are "
                    "only fast when torch.compile fuses them.")
    if cfg.model == ModelName.RESNET.value:
        return ("fp8 will not speed up this ResNet: torchao converts only nn.Linear layers, and "
                "its matrix work is in convolutions, which stay in bf16. Use bf16-amp."
                + compile_hint)
    shapes = [s for s in linear_gemm_shapes(cfg) if s[2] % 16 == 0 and s[3] % 16 == 0]
    if not shapes:
        return "No layer of this model has fp8-eligible shapes (multiples of 16); use bf16-amp."
    flops = {name: 2.0 * m * k * n for name, m, k, n in shapes}
    big = sum(flops[name] for name, m, k, n in shapes if min(m, k, n) >= FP8_MIN_GEMM_DIM)
    if big >= 0.5 * sum(flops.values()):
        return None if cfg.compile else compile_hint.strip()
    name, m, k, n = max(shapes, key=lambda s: flops[s[0]])
    return (f"fp8 is likely slower than bf16 here: the largest GEMM ({name}) is "
            f"M={m} x K={k} x N={n}, and torchao's benchmarks show fp8 only pays when M, K "
            f"and N are all above about {FP8_MIN_GEMM_DIM}-4096 (the per-tensor scaling "
            f"costs more than the faster matmul saves on small GEMMs). Use bf16-amp, or a "
            f"bigger model (size=medium) and more tokens per step (batch_size x seq_len)."
            + compile_hint)
