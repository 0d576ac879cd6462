"""The paper's findings as data: which runs each needs, what is compared, and the paper's claim.

Nothing here computes anything. A `Finding` lists the training runs it needs (`RUNS`, shared between
findings: the left-to-right run serves Findings 1 and 2 and the order sweep), the analyses it needs
beyond training curves (ensembles, generation perplexity, the speed benchmark), the curves to
overlay, and its `Check`s: claims of the form "A is lower than B" or "A is within a margin of B",
each decided from the measured numbers by the rule in `aogpt.stats`.

Quantities: a validation curve of a run (``l2r``: left-to-right loss, ``any``: any-order loss under
uniform orders, ``own``: the loss in the run's own fixed order) at a stage (``early``: the mean of the
evaluations in the first half of training, the paper's "convergence speed"; ``final``: the last
evaluation), a number from an analysis, or a constant. All curves are of the weights the run is
judged by: the EMA weights (equal to the raw weights for runs without EMA).
"""

from __future__ import annotations

from dataclasses import dataclass

# The paper's EMA decays; each run scales them to its length (`aogpt.reproduce.scale.ema_decay`).
EMA_DECAYS = ("none", "0.99", "0.999", "0.9999")


@dataclass(frozen=True)
class RunSpec:
    """One training run: model family, target-position injection (None: the family's own), training
    order and EMA (one of `EMA_DECAYS`). Every run of a command has the same size, data and steps."""

    key: str
    label: str
    variant: str = "aogpt"
    order: str = "mixture:0.1"
    target: str | None = None
    ema: str = "0.9999"
    fim_rate: float = 0.0  # fill in the middle (a left-to-right GPT only; `aogpt.data.fim`)
    infill_budget: int | None = None  # the infilling finding's runs: which of `Scale.infill_budgets` (None: others)


def _runs(*specs: RunSpec) -> dict[str, RunSpec]:
    return {s.key: s for s in specs}


MALLOWS_THETAS = (0.03, 0.1, 0.3, 1.0)
# The infilling finding (`aogpt.reproduce.infill`): its models (key, label, variant, order, FIM rate), its two
# budgets (`Scale.infill_budgets`) and span lengths.
INFILL_MODELS = (("aogpt", "AO-GPT (AO-GPT's orders)", "aogpt", "mixture:0.1", 0.0),
                 ("fim", "GPT-FIM (fill in the middle, rate 0.5)", "gpt", "l2r", 0.5),
                 ("gpt", "GPT (left to right)", "gpt", "l2r", 0.0))
INFILL_BUDGET_NAMES = ("smaller", "larger")
INFILL_LENGTHS = (8, 32, 64)


def infill_key(model: str, sides: str, length: int, budget: int) -> str:
    """The infilling analysis's name for one number: ``aogpt both L=8 smaller``, ``gpt prefix L=64 larger``."""
    return f"{model} {sides} L={length} {INFILL_BUDGET_NAMES[budget]}"

# The decoder of the order studies is AO-GPT's block stack with AO-GPT's EMA. Every run in orders other
# than left to right or one fixed order starts as the library recommends for any-order training
# (`aogpt.config.any_order_start`, applied by `aogpt.reproduce.scale.configs`), without which AO-GPT's
# blocks stay on the unigram plateau at CPU scale. Fig. 7 and 9 compare sigma-GPT blocks with each
# target injection under the same start.
RUNS: dict[str, RunSpec] = _runs(
    # one decoder under different training orders, with the AO-GPT recipe's EMA
    RunSpec("l2r", "left to right (GPT)", order="l2r"),
    RunSpec("uniform", "uniform orders (any order)", order="uniform"),
    RunSpec("mixture", "uniform + 10% left to right (AO-GPT's orders)", order="mixture:0.1"),
    RunSpec("fixed-random", "one fixed random order", order="fixed-random:0"),
    RunSpec("blockwise", "fixed block-wise (0->2->3->1)", order="blockwise:4"),
    *(RunSpec(f"mallows-{t:g}", f"Mallows theta={t:g}", order=f"mallows:{t:g}") for t in MALLOWS_THETAS),
    # EMA ablation of the AO-GPT recipe (the 0.9999 run is "mixture")
    *(RunSpec(f"mixture-ema-{d}", f"EMA {d}", order="mixture:0.1", ema=d) for d in ("none", "0.99", "0.999")),
    # sigma-GPT's blocks on uniform orders: target-position injection without EMA (Fig. 7), beside AO-GPT's
    # own blocks, and adaLN x EMA (Fig. 9)
    *(RunSpec(f"sigma-{t}", f"sigma-GPT, target {t}", variant="sigma", order="uniform", target=t, ema="none")
      for t in ("input", "input-concat", "every-block", "per-block", "adaln")),
    RunSpec("aogpt-blocks", "AO-GPT blocks (adaLN, RMSNorm, QK-norm)", order="uniform", ema="none"),
    RunSpec("sigma-ema", "sigma-GPT + EMA", variant="sigma", order="uniform"),
    RunSpec("sigma-adaln-ema", "sigma-GPT + adaLN + EMA", variant="sigma", order="uniform", target="adaln"),
    # the encoder-only masked diffusion model, same size, same recipe
    RunSpec("encoder", "encoder-only MDM", variant="encoder-mdm", order="uniform"),
    # the infilling finding: AO-GPT, a fill-in-the-middle GPT and a GPT, on equal tokens at each of two budgets,
    # with a context that holds a 64-token span and its two sides
    *(RunSpec(f"infill-{model}-{b}", f"{label}, {INFILL_BUDGET_NAMES[b]} budget", variant=variant, order=order,
              fim_rate=rate, infill_budget=b)
      for b in range(len(INFILL_BUDGET_NAMES)) for model, label, variant, order, rate in INFILL_MODELS),
)


@dataclass(frozen=True)
class Quantity:
    """What a check compares: a run's curve (`source` "curve": `run`, `metric`, `stage`), a number
    an analysis measured (`source` = the analysis, `metric` = its key), or a constant."""

    source: str
    metric: str = ""
    run: str = ""
    stage: str = "final"
    value: float = 0.0

    def label(self, labels: dict[str, str]) -> str:
        if self.source == "const":
            return f"{self.value:g}"
        if self.source == "curve":
            what = {"l2r": "left-to-right", "any": "any-order", "own": "own-order"}[self.metric]
            return f"{labels.get(self.run, self.run)}: {what} loss ({self.stage})"
        return self.metric


def curve(run: str, metric: str, stage: str = "final") -> Quantity:
    return Quantity("curve", metric, run, stage)


def value(analysis: str, key: str) -> Quantity:
    return Quantity(analysis, key)


def const(x: float) -> Quantity:
    return Quantity("const", value=x)


@dataclass(frozen=True)
class Check:
    """One claim: `a` lower than `b` (rule "lower"), or `a` at most `margin` above `b` ("within")."""

    claim: str
    a: Quantity
    b: Quantity
    rule: str = "lower"
    margin: float = 0.0
    unit: str = "nats/token"


@dataclass(frozen=True)
class Panel:
    """One plot panel: a curve metric of the finding's runs (or of `runs`, when given)."""

    metric: str
    title: str
    runs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Finding:
    key: str
    title: str
    claim: str  # the paper's words
    runs: tuple[str, ...] = ()
    analyses: tuple[str, ...] = ()
    checks: tuple[Check, ...] = ()
    panels: tuple[Panel, ...] = ()
    notes: str = ""
    labels: tuple[tuple[str, str], ...] = ()  # (run, label) where this finding names a shared run otherwise

    def label(self, run: str) -> str:
        return dict(self.labels).get(run, RUNS[run].label)


def _early_final(claim: str, a: tuple[str, str], b: tuple[str, str]) -> tuple[Check, Check]:
    return (Check(f"{claim} (early)", curve(*a, "early"), curve(*b, "early")),
            Check(f"{claim} (final)", curve(*a, "final"), curve(*b, "final")))


ENSEMBLE_SIZES = (1, 2, 4, 8)
ANNEALING = (("none", 1.0, 1.0), ("mild", 0.95, 0.9), ("appropriate", 0.95, 0.7))

FINDINGS: dict[str, Finding] = {f.key: f for f in (
    Finding(
        "f1", "Finding 1 (Fig. 2): any-order training converges slower",
        "Any-Order GPT converges significantly slower in initial training stages compared to its standard "
        "GPT counterpart when both utilize the same architecture.",
        runs=("l2r", "uniform"),
        checks=(Check("GPT's left-to-right loss is below AO-GPT's any-order loss early in training",
                      curve("l2r", "l2r", "early"), curve("uniform", "any", "early")),),
        panels=(Panel("l2r", "Left-to-Right"), Panel("any", "Any-Order")),
        labels=(("uniform", "uniform orders (AO-GPT)"),),
        notes="Both runs use the same decoder; GPT is it trained left to right, AO-GPT under uniform orders. "
              "Each is judged on its own objective, as in the paper's Fig. 2."),
    Finding(
        "f2", "Findings 2.1 / 2.2 (Fig. 3a): fixed orders",
        "2.1 (its text is missing from our copy of the paper; read from Fig. 3a and Section 3): a fixed "
        "left-to-right order converges faster than one fixed random order. 2.2: fixed block-wise random "
        "serves as an interpolation between left-to-right and purely random order in terms of convergence speed.",
        runs=("l2r", "fixed-random", "blockwise"),
        checks=(Check("2.1: left to right converges faster than a fixed random order",
                      curve("l2r", "l2r", "early"), curve("fixed-random", "own", "early")),
                Check("2.2: block-wise converges slower than left to right",
                      curve("l2r", "l2r", "early"), curve("blockwise", "own", "early")),
                Check("2.2: block-wise converges faster than a fixed random order",
                      curve("blockwise", "own", "early"), curve("fixed-random", "own", "early"))),
        panels=(Panel("own", "Loss in the training order", ()),),
        notes="Each model is scored in the one order it is trained on."),
    Finding(
        "f3", "Findings 3.1 / 3.2 (Fig. 3b): 10% left-to-right data",
        "3.1: Incorporating a small fraction (10%) of explicitly Left-to-Right ordered data into the training "
        "of an AO-GPT drastically improves its performance (both convergence speed and final loss) when "
        "evaluated on standard Left-to-Right. 3.2: A small fraction (10%) of Left-to-Right data can even "
        "improve the model performance on Any-Order data.",
        runs=("uniform", "mixture"),
        checks=(*_early_final("3.1: with 10% left to right, the left-to-right loss is lower",
                              ("mixture", "l2r"), ("uniform", "l2r")),
                Check("3.2: with 10% left to right, the any-order loss is lower (final)",
                      curve("mixture", "any"), curve("uniform", "any"))),
        panels=(Panel("l2r", "Left-to-Right"), Panel("any", "Any-Order"))),
    Finding(
        "injection", "Fig. 7: target-position injection",
        "The former two ways [re-applying the target encoding at every block; a table per block] demonstrate "
        "some early training acceleration compared to the baseline, but their advantages diminish in later "
        "stages [...]. In contrast, the adaptive LayerNorm (adaLN) approach shows consistent improvements "
        "throughout the entire training process.",
        runs=("sigma-input", "sigma-input-concat", "sigma-every-block", "sigma-per-block", "sigma-adaln",
              "aogpt-blocks"),
        checks=_early_final("adaLN beats the input-only baseline", ("sigma-adaln", "any"), ("sigma-input", "any")),
        panels=(Panel("any", "Any-Order"), Panel("l2r", "Left-to-Right")),
        notes="sigma-GPT blocks trained on uniform orders without EMA, each with the any-order start; only the "
              "injection differs. The verdict is on adaLN; the other injections' numbers are in the table, beside "
              "AO-GPT's own blocks (adaLN with RMSNorm and QK-norm) under the same training."),
    Finding(
        "ema", "Fig. 8: EMA decay",
        "All tested EMA configurations outperformed the baseline model (no EMA). Notably, an EMA decay rate "
        "of 0.9999 yielded the best performance among the values tested.",
        runs=("mixture-ema-none", "mixture-ema-0.99", "mixture-ema-0.999", "mixture"),
        checks=(*(Check(f"EMA {d} beats no EMA", curve(r, "any"), curve("mixture-ema-none", "any"))
                  for d, r in (("0.99", "mixture-ema-0.99"), ("0.999", "mixture-ema-0.999"), ("0.9999", "mixture"))),
                Check("EMA 0.9999 beats 0.999", curve("mixture", "any"), curve("mixture-ema-0.999", "any")),
                Check("EMA 0.9999 beats 0.99", curve("mixture", "any"), curve("mixture-ema-0.99", "any"))),
        panels=(Panel("any", "Any-Order"), Panel("l2r", "Left-to-Right")),
        labels=(("mixture", "EMA 0.9999"),),
        notes="The decoder with AO-GPT's orders (10% left to right), each decay scaled to the run's length (see "
              "the scale). The runs share their raw-weight trajectory (same seed): differences are the EMA's "
              "alone."),
    Finding(
        "adaln-ema", "Fig. 9: adaLN x EMA",
        "These two enhancements are largely orthogonal, with their combination leading to significantly "
        "improved convergence and lower final loss values compared to the baseline sigma-GPT and models with "
        "only one of the improvements.",
        runs=("sigma-input", "sigma-adaln", "sigma-ema", "sigma-adaln-ema"),
        checks=tuple(Check(f"adaLN + EMA beats {other_label} ({kind})", curve("sigma-adaln-ema", m), curve(other, m))
                     for m, kind in (("l2r", "left to right"), ("any", "any order"))
                     for other, other_label in (("sigma-input", "the baseline"), ("sigma-adaln", "adaLN alone"),
                                                ("sigma-ema", "EMA alone"))),
        panels=(Panel("l2r", "Left-to-Right"), Panel("any", "Any-Order")),
        labels=(("sigma-input", "sigma-GPT"), ("sigma-adaln", "sigma-GPT + adaLN")),
        notes="sigma-GPT blocks on uniform orders with the any-order start; EMA is the scaled 0.9999."),
    Finding(
        "f6", "Finding 6 (Fig. 4): decoder vs encoder, context-order ensembles",
        "Decoder-only AO-AR fall shorts of their Encoder-only counterpart, while ensemble on order context "
        "fill the gap.",
        runs=("mixture", "encoder"), analyses=("ensemble",),
        checks=(Check("the decoder's any-order NLL is above the encoder's", value("ensemble", "encoder"),
                      value("ensemble", "decoder M=1")),
                Check("ensembling 8 context orders lowers the decoder's NLL", value("ensemble", "decoder M=8"),
                      value("ensemble", "decoder M=1")),
                Check("with 8 context orders the decoder is within 0.02 nats/token of the encoder",
                      value("ensemble", "decoder M=8"), value("ensemble", "encoder"), rule="within", margin=0.02)),
        labels=(("mixture", "decoder (AO-GPT's orders and EMA)"),),
        notes="Any-order NLL (the masked-diffusion bound) per token on held-out sequences, EMA weights. The "
              "decoder is trained with AO-GPT's orders and EMA."),
    Finding(
        "speed", "Findings 7 / 8.1 (Fig. 5): generation speed",
        "7: The computation complexity of generating a length n sequence using encoder-only AO-AR is O(n^2); "
        "with both KV-cache and Lemma 4.1, decoder-only AO-AR's computation complexity is O(n). "
        "8.1: AO-GPT can achieve 25x speedup on generation compared with SEDD.",
        analyses=("speed",),
        checks=(Check("7: the encoder's model evaluations grow with the steps T (log-log slope above 0.5)",
                      const(0.5), value("speed", "slots slope encoder"), unit="slope"),
                Check("7: AO-GPT's model evaluations do not grow with T (log-log slope below 0.5)",
                      value("speed", "slots slope aogpt"), const(0.5), unit="slope"),
                Check("8.1: AO-GPT generates faster than the encoder at T = n",
                      value("speed", "log time aogpt"), value("speed", "log time encoder"), unit="log seconds")),
        notes="`aogpt bench generate` at the runs' model size (random weights: speed does not depend on them). "
              "Finding 7 is about computation, so it is counted: positions run through the model (slot "
              "evaluations) for a batch, an exact number. Finding 8.1 is timed. The paper's 25x is at n = 1024 "
              "against SEDD; our ratio at our n is in the table."),
    Finding(
        "genppl", "Finding 8.2 (Table 1): generation perplexity under annealing",
        "AO-GPT exhibits higher generation perplexity without logit annealing, while appropriate annealing "
        "brings its perplexity to a comparable level.",
        runs=("mixture", "encoder", "l2r"), analyses=("genppl",),
        checks=(Check("without annealing AO-GPT's samples score worse than the encoder's",
                      value("genppl", "encoder none"), value("genppl", "aogpt none")),
                Check("with appropriate annealing AO-GPT is within 10% generation perplexity of the encoder",
                      value("genppl", "aogpt appropriate"), value("genppl", "encoder appropriate"),
                      rule="within", margin=0.0953)),
        labels=(("mixture", "AO-GPT (the decoder with AO-GPT's orders and EMA)"), ("l2r", "scorer (left to right)")),
        notes="Samples in float64 with T = n steps, scored by our left-to-right model trained in the same command "
              "(its NLL per token; 0.0953 nats = log 1.1). Low temperatures also lower the samples' entropy."),
    Finding(
        "orders", "Open question: which orders matter (Mallows sweep)",
        "(Not a claim of the paper.) The paper samples the trade-off between left-to-right and any-order "
        "quality at two points: uniform orders and the 10% left-to-right mixture.",
        runs=("l2r", *(f"mallows-{t:g}" for t in sorted(MALLOWS_THETAS, reverse=True)), "uniform", "mixture"),
        panels=(Panel("l2r", "Left-to-Right"), Panel("any", "Any-Order")),
        notes="Mallows orders P(sigma) ~ exp(-theta * inversions): theta = 0 is uniform, theta -> infinity "
              "left to right."),
    Finding(
        "infill", "Infilling: AO-GPT against a fill-in-the-middle GPT",
        "(Not a claim of the paper; its case for any-order models.) A model that reads any order fills a gap "
        "given the text on both sides. What a user would otherwise pick is a left-to-right GPT trained to fill "
        "in the middle (Bavarian et al. 2022): the any-order model's case is made only if it fills gaps better "
        "than that, given the same text and trained on as many tokens.",
        runs=tuple(f"infill-{m[0]}-{b}" for b in range(len(INFILL_BUDGET_NAMES)) for m in INFILL_MODELS),
        analyses=("infill",),
        checks=tuple(Check(f"AO-GPT given both sides beats GPT-FIM given both sides ({n} tokens, "
                           f"{INFILL_BUDGET_NAMES[b]} budget)",
                           value("infill", infill_key("aogpt", "both", n, b)),
                           value("infill", infill_key("fim", "both", n, b)),
                           unit="bits/byte")
                     for b in range(len(INFILL_BUDGET_NAMES)) for n in INFILL_LENGTHS),
        notes="Bits per byte of held-out spans of 8, 32 and 64 tokens (bytes) with the same context on each side, "
              "the same spans for every model and seed. AO-GPT reads the sides, then the span in its own order "
              "(left to right or its confidence order, chosen on other spans); GPT-FIM reads prefix, suffix, then "
              "the span and its end token (the probability that the gap holds exactly the span); GPT reads the "
              "prefix only. The three are trained on equal tokens (the same steps, batch and context) at two "
              "budgets; the left-to-right price of each is its validation loss against the GPT's."),
)}

# The training-recipe findings: claims about how to train, decided over seeds by default (one run per model
# cannot tell a recipe's effect from a lucky seed). The others measure trained models (ensembles, samples,
# speed, the sweep) and run on the first seed.
RECIPE = ("f1", "f2", "f3", "injection", "ema", "adaln-ema", "infill")
# Findings run only when named (`aogpt reproduce infill`): their cost would take the default past its hour
# (docs/reproduce.md, "The infilling finding").
OPTIONAL = ("infill",)

# Aliases users may type for a finding.
ALIASES = {"1": "f1", "2": "f2", "2.1": "f2", "2.2": "f2", "3": "f3", "3.1": "f3", "3.2": "f3", "6": "f6",
           "7": "speed", "8.1": "speed", "8.2": "genppl", "fig2": "f1", "fig3a": "f2", "fig3b": "f3",
           "fig4": "f6", "fig5": "speed", "fig7": "injection", "fig8": "ema", "fig9": "adaln-ema",
           "table1": "genppl", "mallows": "orders", "fim": "infill", "infilling": "infill"}
