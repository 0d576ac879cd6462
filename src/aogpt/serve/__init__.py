"""`aogpt serve`: exact any-order decoding as an HTTP service, and a page to watch it (docs/serve.md).

    batching.py  one forward for the steps of many requests, row for row what each computes alone
    jobs.py      a request (Job), the engine's limits and deadlines, the errors a request can end with
    engine.py    continuous batching: admission, deadlines, the step loop, liveness (usable without HTTP)
    protocol.py  the OpenAI completions subset plus aogpt's fields: requests as plans, choices, stream chunks
    openai.py    what suffix, a gap without a length, echo and logprobs run as, and the response's layout
    app.py       the FastAPI app: /v1/completions, /v1/models, /health, the page at /
    logs.py      the server's log output through a bounded queue: it never blocks the server
    static/      the page (one HTML file, no build step, nothing from elsewhere)

From Python, without HTTP::

    from aogpt.serve import Engine
    with Engine(aogpt.load(run).model) as engine:
        result = engine.run(length=64, seed=0)   # the same tokens as aogpt.generate(model, length=64, seed=0)
"""

from typing import Any

from aogpt.serve.jobs import Busy, Cancelled, Draining, EngineLimits, Job

__all__ = ["Busy", "Cancelled", "Draining", "Engine", "EngineLimits", "Job"]


def __getattr__(name: str) -> Any:
    """`Engine` on first use: it needs greenlet, which a machine without the server's packages lacks, and
    the command line reads the limits (`EngineLimits`) of every command, `aogpt serve`'s too."""
    if name == "Engine":
        from aogpt.serve.engine import Engine

        return Engine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
