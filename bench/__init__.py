"""Benchmarks: smg-node and the reference gateway (SMG) side by side in front of one simulated worker."""
