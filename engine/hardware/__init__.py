"""The machine: devices and what each precision mode means on them, the one NVML wrapper,
the GPU catalogue, telemetry, peak FLOP/s, the device check and doctor. No torch at
module level."""
