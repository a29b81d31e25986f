"""Profiler traces read and judged: the streaming reader, the kernel table, kernel-name
rules, the Tensor-Core verdict, time accounting, bound-by, one trace explained and rank
sets side by side. No pandas, no torch."""
