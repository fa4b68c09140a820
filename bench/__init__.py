"""Benchmarks printing the figures of the performance targets."""
