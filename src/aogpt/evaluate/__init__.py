"""Old import path, kept working: evaluation lives in `aogpt.evaluation` and this name is
`aogpt.evaluation.evaluate`.

``aogpt.evaluate(model, data, ...)``, ``from aogpt.evaluate import evaluate, conditional_logprobs``
and other code written against this path get that module itself: the same object, so nothing here
can drift from it and patching one patches the other. New code imports `aogpt.evaluation.evaluate`.
"""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("aogpt.evaluation.evaluate")
