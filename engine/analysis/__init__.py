"""Pure analysis, no torch, no store writes: kernel names, traces and the Tensor-Core
verdict, CPU oneDNN evidence, steady statistics and comparisons, numerics records."""
