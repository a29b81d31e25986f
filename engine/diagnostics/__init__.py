"""Is this node healthy and what does each precision buy on it: the device check (a few
timed matmuls per mode under the profiler, Tensor-Core evidence from the kernel names,
the measured peaks refreshed) and doctor (the build and what it sees). Above analysis:
the check judges its kernels with the kernel-name rules."""
