"""Fill in the middle (Bavarian et al. 2022, "Efficient Training of Language Models to Fill in the Middle"):
the sentinel tokens, the transformation of training rows and the rows a trained model is asked with.

**Sentinels.** Four ids appended after the tokenizer's own (its text ids and EOT), held the way the
tokenizer module holds its special token EOT: they stand for no bytes, `encode` never returns them,
`decode` writes them as their text (`FIM_TEXT`), and a model's vocabulary is padded past them.

    END    = V        end of the middle (the model learns where the middle stops)
    PREFIX = V + 1    PSM: PREFIX prefix SUFFIX suffix MIDDLE middle END
    SUFFIX = V + 2    SPM: PREFIX SUFFIX suffix MIDDLE prefix middle END
    MIDDLE = V + 3

(V = the tokenizer's `vocab_size`.) END comes first so that one vocabulary limit
(`aogpt.sampling.SamplingConfig.vocab_limit`) of V lets a sampler draw text only (a gap of a given
length), and V + 1 text or the end. SPM is the paper's variant of Appendix D (the prefix moved after the
suffix's sentinel), in which the middle continues the prefix directly.

**The transformation** (`fim_rows`), applied to a training batch of windows of n tokens: each row
independently becomes a FIM row with probability `rate`, in SPM with probability `spm_rate` and in PSM
otherwise; every other row is left exactly as it was (a plain left-to-right row). A FIM row takes a
*document* of D tokens from the start of its window, D uniform in 1 .. n - 4, draws two cut points
uniformly among its D + 1 token boundaries (sorted; the middle may be empty), rearranges prefix /
middle / suffix with the sentinels and closes the middle with END; the window's next n - 4 - D tokens
follow as plain text, so rows keep their length and a batch its shape. Were every document the whole
window, END would always sit in the row's last slot and the model would learn the middle's length from
the position alone: given a gap whose row is shorter it would expect more middle, given one whose row
fills the context it would know where to stop. With D drawn, END's position says nothing, but for
one thing: a middle still open in the row's last slot must end there, so a row scored with
`aogpt.evaluation.infill.fim_span_nll` should leave slots free (`aogpt reproduce infill` leaves 12).
The paper's documents have their own lengths, to the same effect. The cuts are token-level:
with the ``bytes`` tokenizer a token is a byte, so they are byte-level, i.e. character-level on ASCII
text. (Character-level cuts for a BPE tokenizer would re-encode the three pieces of every row while
training and make rows of unequal length; the paper reports token-level cuts cost little.) A
document boundary inside a window (an EOT) is text like any other here: the paper's "context-level"
FIM splits at EOT first, which matters for short documents and not for the plays' long ones.

The random draws come from their own generator (`aogpt.train` seeds it from the run's seed and keeps
it in checkpoints), so a FIM run reads exactly the windows a plain run of the same seed reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aogpt.data.tokenizer_base import Tokenizer
from aogpt.errors import AOGPTError

FIM_TEXT = ("<|fim_end|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")  # ids V, V + 1, V + 2, V + 3
SENTINELS = len(FIM_TEXT)
MODES = ("psm", "spm")


@dataclass(frozen=True)
class Sentinels:
    """The four sentinel ids of a FIM model (module docstring)."""

    end: int
    prefix: int
    suffix: int
    middle: int

    @staticmethod
    def after(vocab_size: int) -> Sentinels:
        """The sentinels appended after a tokenizer of `vocab_size` ids."""
        return Sentinels(vocab_size, vocab_size + 1, vocab_size + 2, vocab_size + 3)

    @staticmethod
    def from_list(ids: Sequence[int]) -> Sentinels:
        """From the list a model config records (`ModelConfig.fim_tokens`: end, prefix, suffix, middle)."""
        if len(ids) != SENTINELS or len(set(ids)) != SENTINELS:
            raise AOGPTError(f"a fill-in-the-middle model records {SENTINELS} distinct sentinel ids, got {list(ids)}",
                             "fix model.fim_tokens in the checkpoint's config.json")
        return Sentinels(*(int(i) for i in ids))

    def to_list(self) -> list[int]:
        return [self.end, self.prefix, self.suffix, self.middle]

    @property
    def text_limit(self) -> int:
        """Ids below this are the tokenizer's own (text and EOT): what a sampler draws inside a gap."""
        return self.end


def sentinels_of(model_or_config: Any) -> Sentinels | None:
    """The sentinels of a model (wrapped or `aogpt.load`'s result) or a model config; None for a model
    not trained to fill in the middle."""
    obj = model_or_config
    if not hasattr(obj, "fim_tokens") and not hasattr(obj, "config"):  # DDP (.module), torch.compile (._orig_mod)
        inner = getattr(obj, "module", getattr(obj, "_orig_mod", None))
        return None if inner is None else sentinels_of(inner)
    obj = obj if hasattr(obj, "fim_tokens") else obj.config
    ids = getattr(obj, "fim_tokens", None)
    return None if not ids else Sentinels.from_list(ids)


class FIMTokenizer(Tokenizer):
    """A tokenizer with the four sentinels after its own ids (module docstring). Text encodes exactly
    as with the base tokenizer (the spec and the saved files are the base's, so data prepared with it
    is the model's data); `text_vocab_size` is the base's size, the ids generation may draw as text."""

    def __init__(self, base: Tokenizer) -> None:
        if isinstance(base, FIMTokenizer):
            base = base.base
        self.base = base
        self.spec = base.spec
        self.eot_id = base.eot_id
        self.text_vocab_size = base.vocab_size
        self.vocab_size = base.vocab_size + SENTINELS
        self.files = base.files
        self.sentinels = Sentinels.after(base.vocab_size)

    def encode(self, text: str) -> list[int]:
        return self.base.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.base.encode_batch(texts)

    def _decode(self, ids: list[int]) -> str:
        parts, run = [], []
        for i in ids:
            if i >= self.text_vocab_size:
                parts.append(self.base.decode(run))
                parts.append(FIM_TEXT[i - self.text_vocab_size])
                run = []
            else:
                run.append(i)
        parts.append(self.base.decode(run))
        return "".join(parts)

    def _byte_lengths(self) -> list[int]:
        return [*self.base.byte_lengths().tolist(), *([0] * SENTINELS)]

    def save(self, directory: Path) -> None:
        self.base.save(directory)


def with_sentinels(tokenizer: Tokenizer) -> FIMTokenizer:
    """`tokenizer` with the fill-in-the-middle sentinels after its ids."""
    return FIMTokenizer(tokenizer)


# --------------------------------------------------------------------------------- the transformation
def arrange(raw: torch.Tensor, cut_lo: torch.Tensor, cut_hi: torch.Tensor, spm: torch.Tensor,
            sentinels: Sentinels, length: torch.Tensor | None = None) -> torch.Tensor:
    """FIM rows (B, m + 4) from windows `raw` (B, m): the first `length` (B,) tokens of each (default
    all m: the document) cut at `cut_lo` <= `cut_hi` <= length (prefix = doc[:lo], middle = doc[lo:hi],
    suffix = doc[hi:]) and rearranged, in SPM where `spm` (B,) bool, else PSM, then END; the rest of
    the window follows as plain text. One gather: every slot names the raw token it holds or a sentinel."""
    B, m = raw.shape
    k = torch.arange(m + SENTINELS, device=raw.device).expand(B, -1)
    lo, hi = cut_lo.to(raw.device)[:, None], cut_hi.to(raw.device)[:, None]
    doc = torch.full_like(lo, m) if length is None else length.to(raw.device)[:, None]
    end = doc + SENTINELS - 1  # where END goes; after it, the window's tokens doc .. m - 1
    suffix_len = doc - hi
    src = torch.where(k > end, k - SENTINELS, torch.full_like(k, -1))  # the raw index each slot copies; -1: sentinel
    tok = torch.full_like(k, sentinels.end)
    # PSM: PRE prefix SUF suffix MID middle END
    psm_src = torch.where((k >= 1) & (k <= lo), k - 1, src)
    psm_src = torch.where((k >= lo + 2) & (k < lo + 2 + suffix_len), hi + k - (lo + 2), psm_src)
    psm_mid = lo + 2 + suffix_len
    psm_src = torch.where((k > psm_mid) & (k < end), lo + k - (psm_mid + 1), psm_src)
    psm_tok = torch.where(k == 0, sentinels.prefix, tok)
    psm_tok = torch.where(k == lo + 1, sentinels.suffix, psm_tok)
    psm_tok = torch.where(k == psm_mid, sentinels.middle, psm_tok)
    # SPM (Appendix D): PRE SUF suffix MID prefix middle END
    spm_src = torch.where((k >= 2) & (k < 2 + suffix_len), hi + k - 2, src)
    spm_mid = 2 + suffix_len
    spm_src = torch.where((k > spm_mid) & (k < end), k - (spm_mid + 1), spm_src)
    spm_tok = torch.where(k == 0, sentinels.prefix, tok)
    spm_tok = torch.where(k == 1, sentinels.suffix, spm_tok)
    spm_tok = torch.where(k == spm_mid, sentinels.middle, spm_tok)
    is_spm = spm.to(raw.device)[:, None]
    src = torch.where(is_spm, spm_src, psm_src)
    tok = torch.where(is_spm, spm_tok, psm_tok)
    copied = raw.gather(1, src.clamp(min=0))
    return torch.where(src >= 0, copied, tok.to(raw.dtype))


def fim_rows(idx: torch.Tensor, rate: float, spm_rate: float, sentinels: Sentinels,
             generator: torch.Generator) -> torch.Tensor:
    """The batch `idx` (B, n) with each row turned into a FIM row with probability `rate` (module
    docstring); the other rows are returned untouched. Draws on the CPU from `generator`: B uniforms
    (which rows), B (which mode), B (the document's length) and 2B (the cuts), the same count whatever
    is chosen."""
    B, n = idx.shape
    if n <= SENTINELS:
        raise AOGPTError(f"fill-in-the-middle rows need more than {SENTINELS} tokens, the context is {n}",
                         "use a larger --block-size")
    pick = torch.rand(B, generator=generator) < rate
    spm = torch.rand(B, generator=generator) < spm_rate
    m = n - SENTINELS
    length = torch.randint(1, m + 1, (B,), generator=generator)  # the document: 1 .. m tokens
    cuts = (torch.rand(B, 2, generator=generator, dtype=torch.float64) * (length[:, None] + 1)).long()
    cuts = torch.minimum(cuts, length[:, None]).sort(dim=1).values  # two uniform draws from {0 .. length}, sorted
    if not bool(pick.any()):
        return idx
    rows = pick.nonzero()[:, 0].to(idx.device)
    out = idx.clone()
    out[rows] = arrange(idx[rows, :m], cuts[pick, 0], cuts[pick, 1], spm[pick], sentinels, length[pick])
    return out


def psm_row(prefix: Sequence[int] | torch.Tensor, suffix: Sequence[int] | torch.Tensor, sentinels: Sentinels,
            middle: Sequence[int] | torch.Tensor = (), end: bool = False) -> list[int]:
    """PREFIX prefix SUFFIX suffix MIDDLE [middle [END]]: what a FIM model is given (and scored on)."""
    ids = [sentinels.prefix, *_ints(prefix), sentinels.suffix, *_ints(suffix), sentinels.middle, *_ints(middle)]
    return ids + [sentinels.end] if end else ids


def _ints(x: Sequence[int] | torch.Tensor | np.ndarray) -> list[int]:
    return [int(t) for t in (x.tolist() if hasattr(x, "tolist") else x)]
