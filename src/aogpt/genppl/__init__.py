"""Old import path, kept working: generation perplexity lives in `aogpt.evaluation.genppl`.

``from aogpt.genppl import make_evaluator, score_samples`` and other code written against this path
get that module itself: the same object, so nothing here can drift from it and patching one patches
the other. New code imports `aogpt.evaluation.genppl`.
"""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("aogpt.evaluation.genppl")
