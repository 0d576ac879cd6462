"""Tests of `aogpt.bench`, one file per module, in sub-folders that mirror its rooms. No timing is
asserted (timed unit tests are flaky on shared machines): only structure, the work each contender
does, the reported ratios' arithmetic and the values computed on the way."""

from aogpt.bench.common import Size

TINY = Size(n_layer=1, n_embd=16, n_head=2, vocab_size=32)
