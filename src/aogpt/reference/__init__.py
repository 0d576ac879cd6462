"""The paper's released checkpoints (the reference implementation's ``.pt`` format).

    format.py    reading and checking a reference checkpoint: architecture, config, keys, EMA
    convert.py   `aogpt import` / `aogpt export`: to our checkpoint directories and back
"""

from aogpt.reference.convert import export_reference, import_reference
from aogpt.reference.format import (
    ReferenceCheckpoint,
    check_state,
    detect_architecture,
    load_reference,
    parameter_names,
    read_reference,
    reference_config,
    reference_incompatibilities,
)

__all__ = ["ReferenceCheckpoint", "check_state", "detect_architecture", "export_reference", "import_reference",
           "load_reference", "parameter_names", "read_reference", "reference_config", "reference_incompatibilities"]
