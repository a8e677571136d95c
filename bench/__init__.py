"""Benchmarks: each prints its figures; none is a timed test."""
