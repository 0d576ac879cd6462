"""Tests of `aogpt.bench.serve`, one file per module."""
