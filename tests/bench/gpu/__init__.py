"""Tests of `aogpt.bench.gpu`, one file per module."""
