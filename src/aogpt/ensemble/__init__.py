"""Old import path, kept working: context-order ensembling (paper Eq. 4) lives in
`aogpt.evaluation.ensemble`.

``from aogpt.ensemble import ensemble_losses`` and other code written against this path get that
module itself: the same object, so nothing here can drift from it and patching one patches the
other. New code imports `aogpt.evaluation.ensemble`.
"""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("aogpt.evaluation.ensemble")
