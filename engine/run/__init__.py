"""A run's processes: launch, stop and reconcile (launcher), the supervisor (worker), THE
trainer session (session) every executor runs, the standby trainer, multi-process runs
(torchrun, rank, ranks), Ray runs as the launcher sees them (ray_runs), the profiler-window
analysis (window) and the run-end data
(finalize). Nothing here imports torch at module level except rank."""
