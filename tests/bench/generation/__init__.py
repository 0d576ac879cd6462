"""Tests of `aogpt.bench.generation`, one file per module."""
