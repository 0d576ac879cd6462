"""The one exception type for user errors.

Everything a user can get wrong (a bad flag, a missing file, a mismatched tokenizer) raises
`AOGPTError`. The CLI prints ``error: <what> (<how to fix>)`` and exits with status 2, without a
traceback. Bugs raise ordinary exceptions and keep their tracebacks.
"""

from __future__ import annotations


class AOGPTError(Exception):
    """A problem with the user's input, with a hint on how to fix it."""

    def __init__(self, what: str, fix: str | None = None):
        self.what = what
        self.fix = fix
        super().__init__(f"{what} ({fix})" if fix else what)


def check_choice(kind: str, value: object, choices: tuple[str, ...]) -> None:
    """Refuse a value outside a fixed set of names, listing the names."""
    if value not in choices:
        raise AOGPTError(f"unknown {kind} {value!r}", f"choose one of: {', '.join(choices)}")
