"""`aogpt serve`: exact any-order decoding as an HTTP service, and a page to watch it (docs/serve.md).

    batching.py  one forward for the steps of many requests, row for row what each computes alone
    engine.py    continuous batching: jobs, admission limits, the step loop (usable without HTTP)
    protocol.py  the OpenAI completions subset plus aogpt's fields; responses and stream chunks
    app.py       the FastAPI app: /v1/completions, /v1/models, /health, the page at /
    static/      the page (one HTML file, no build step, nothing from elsewhere)

From Python, without HTTP::

    from aogpt.serve import Engine
    with Engine(aogpt.load(run).model) as engine:
        result = engine.run(length=64, seed=0)   # the same tokens as aogpt.generate(model, length=64, seed=0)
"""

from aogpt.serve.engine import Busy, Cancelled, Draining, Engine, EngineLimits, Job

__all__ = ["Busy", "Cancelled", "Draining", "Engine", "EngineLimits", "Job"]
