"""Tests of `aogpt.bench.training`, one file per module."""
