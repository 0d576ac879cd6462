"""Old import path, kept working: generation's public entry point lives in
`aogpt.generation.generate`.

``aogpt.generate(model, ...)``, ``from aogpt.generate import generate, infill`` and other code
written against this path get that module itself: the same object, so nothing here can drift from
it and patching one patches the other. New code imports `aogpt.generation.generate`.
"""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("aogpt.generation.generate")
