"""Evaluation: how well a model predicts text, in one place.

    evaluate.py   exact per-order NLL, the any-order bound with error bars, per-sequence NLLs,
                  conditional_logprobs; the entry point (``aogpt.evaluate(model, data, ...)``)
    ensemble.py   context-order ensembles (paper Eq. 4) and their subset-of-positions estimator
    infill.py     exact likelihood of a held-out span given prefix and suffix, on model-independent cuts
                  (``aogpt.evaluate_infill``)
    genppl.py     generation perplexity: an evaluator model scores generated text

`aogpt eval` drives all of it; zero-shot suites read their data with `aogpt.data.zeroshot`. How a
model is scored (one causal pass per order, the encoder's passes) is asked of its family
(`aogpt.families`). See docs/evaluation.md.
"""
