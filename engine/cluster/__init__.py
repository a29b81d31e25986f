"""Sweeps, on this machine's device queue or on a Ray cluster (ray is imported only by the
driver process and on the nodes)."""
