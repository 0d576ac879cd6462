"""Generation: the public entry point and the machinery behind it, in one place.

    generate.py      generate() / infill() (``aogpt.generate(model, ...)``, ``aogpt.infill``): resolve
                     the request, run each batch's sampler, assemble the result
    settings.py      GenerationSettings = SamplingConfig (token rules) + DecodePlan (steps, policy,
                     schedule, order) + batch size and KV cache
    conditioning.py  prompts and infilling templates -> the known (position, token) pairs
    plan.py          chain orders and per-step counts, drawn before the model runs
    samplers.py      which sampler decodes a model, from its family's capabilities
    decoder.py       the decoders' KV-cache sampler (parallel query slots, catch-ups, Lemma 4.1)
    speculative.py   exact self-speculative decoding (several tokens per forward pass)
    adaptive.py      adaptive orders (confidence, margin, entropy): the model picks where to reveal
    encoder.py       the encoder-only MDM's reverse process, in a fixed or an adaptive order
    infill.py        infilling methods (an order, or the best of D drafts scored exactly), passages with
                     [[hidden words]], the filled words a word check counts
    fim.py           infilling with a fill-in-the-middle GPT: each gap after its prefix and suffix
"""
