"""The machine: devices and what each precision mode means on them, the one NVML wrapper,
the GPU catalogue, telemetry, host contention, the CPU matrix units, peak FLOP/s and the
torch dtype map with the TF32 switches. No torch at module level."""
