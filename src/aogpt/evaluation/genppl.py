"""Generation perplexity: how likely an evaluator language model finds generated text.

Protocol (MDLM-style, adjusted so every token is scored):

* Each sample is text. It is cut at its first ``<|endoftext|>`` (how an EOT id decodes); the text
  before it is re-tokenized with the *evaluator's* tokenizer, and the evaluator's EOS is appended
  when the sample had an EOT (the model chose to stop, so that choice is scored too).
* The tokens are scored left to right in non-overlapping windows of ``context - 1`` tokens, each
  window fed after one EOS token as its start-of-text context (GPT-2's convention); windows do not
  see each other.
* Generation perplexity = exp(total NLL / total scored tokens) over all samples (token-weighted, as
  MDLM's metric). Beside it, the mean over samples of the unigram entropy (nats) of each sample's
  evaluator tokens (EOS excluded): degenerate repetition shows up as low entropy with deceptively
  low perplexity.

Evaluators: any checkpoint of ours read left to right (`aogpt.load`; offline), or ``hf:NAME`` (e.g.
``hf:gpt2-large``, the paper's) when ``transformers`` and the weights are available.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from aogpt.errors import AOGPTError
from aogpt.functional import token_nll

EOT_TEXT = "<|endoftext|>"


class Evaluator:
    """A left-to-right scorer: `encode` text, `nll` of every token after the first of each row."""

    name: str = ""
    context: int = 0
    eos_id: int = 0
    device: torch.device = torch.device("cpu")

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def nll(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, L) ids -> (B, L-1) -log p(idx[:, t] | idx[:, :t]) for t = 1..L-1."""
        raise NotImplementedError


class CheckpointEvaluator(Evaluator):
    """One of our checkpoints (any decoder variant), read left to right."""

    def __init__(self, loaded: Any, name: str = "") -> None:
        if loaded.tokenizer is None:
            raise AOGPTError(f"evaluator {name} has no tokenizer saved with it", "use a checkpoint trained by aogpt")
        if not loaded.config.causal:
            raise AOGPTError(f"evaluator {name} is an encoder-only model", "use a gpt, sigma or aogpt checkpoint")
        self.model, self.tokenizer, self.name = loaded.model, loaded.tokenizer, name or str(loaded.path)
        self.context = loaded.config.block_size
        self.eos_id = loaded.tokenizer.eot_id
        self.device = next(self.model.parameters()).device

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def nll(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)[1][:, 1:]


class HFEvaluator(Evaluator):
    """A Hugging Face causal LM (``hf:gpt2-large``, or a local folder: ``hf:PATH``, our exported
    folders included), loaded lazily; needs `transformers`."""

    def __init__(self, name: str, device: str | torch.device = "cpu") -> None:
        try:
            import transformers

            import aogpt.hf  # noqa: F401 (registers our exported folders with AutoModelForCausalLM)
        except ImportError:
            raise AOGPTError(f"evaluator hf:{name} needs the package transformers",
                             "pip install transformers, or use one of our checkpoints as --evaluator") from None
        try:
            self.tok = transformers.AutoTokenizer.from_pretrained(name)
            self.model = transformers.AutoModelForCausalLM.from_pretrained(name).to(device).eval()
        except Exception as exc:  # offline, unknown name, missing weights
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise AOGPTError(f"cannot load hf:{name} ({first})",
                             "make its weights available (HF cache) or use one of our checkpoints") from None
        self.name, self.device = f"hf:{name}", torch.device(device)
        cfg = self.model.config
        self.context = int(getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", 1024))
        self.eos_id = int(self.tok.eos_token_id)

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def nll(self, idx: torch.Tensor) -> torch.Tensor:
        return token_nll(self.model(idx).logits[:, :-1], idx[:, 1:])


def make_evaluator(spec: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Evaluator:
    """``hf:NAME`` or a checkpoint path (a run directory or a ckpt-* directory; EMA weights)."""
    if spec.startswith("hf:"):
        return HFEvaluator(spec[3:], device)
    from aogpt.checkpoint import load

    return CheckpointEvaluator(load(spec, device=device, dtype=dtype), spec)


def read_samples(path: Path) -> list[str]:
    """Samples from ``.jsonl`` (per line: {"text": ...} or a JSON string), ``.json`` (a list of strings
    or an object with "samples" or "texts", as `aogpt sample --json` / GenerationResult.to_dict
    write), or any other text file (one sample per line)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise AOGPTError(f"samples file {path} does not exist", "check the path")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise AOGPTError(f"samples file {path} is not UTF-8", "convert it to UTF-8") from None
    if path.suffix == ".json":
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise AOGPTError(f"{path} is not valid JSON ({exc.msg})", "fix the file") from None
        if isinstance(obj, dict):
            obj = obj.get("samples", obj.get("texts"))
        if not isinstance(obj, list) or not all(isinstance(s, str) for s in obj):
            raise AOGPTError(f"{path} holds no list of sample strings", 'write ["...", ...] or {"samples": [...]}')
        samples = obj
    elif path.suffix == ".jsonl":
        from aogpt.data.zeroshot import jsonl_rows

        samples = jsonl_rows(text, str(path))
    else:
        samples = [line for line in text.splitlines() if line.strip()]
    if not samples:
        raise AOGPTError(f"{path} contains no samples", "generate some first (aogpt sample)")
    return samples


def unigram_entropy(ids: Sequence[int]) -> float:
    """Entropy (nats) of the empirical token distribution of one sample."""
    if not ids:
        return 0.0
    total = len(ids)
    return -sum(c / total * math.log(c / total) for c in Counter(ids).values())


@dataclass
class GenPPLResult:
    genppl: float
    nll: float  # mean per scored token
    tokens: int
    samples: int
    empty_samples: int
    entropy: float  # mean unigram entropy per sample (nats)
    evaluator: str
    per_sample_nll: list[float]

    def to_dict(self, per_sample: bool = False) -> dict[str, Any]:
        out = asdict(self)
        if not per_sample:
            out.pop("per_sample_nll")
        return out


def sample_tokens(evaluator: Evaluator, text: str) -> list[int]:
    """The evaluator's tokens of one sample: up to its first EOT, plus EOS if it had one."""
    cut = text.find(EOT_TEXT)
    ids = evaluator.encode(text if cut < 0 else text[:cut])
    return ids + [evaluator.eos_id] if cut >= 0 else ids


@torch.inference_mode()
def score_samples(evaluator: Evaluator, texts: Sequence[str], batch_size: int = 8, progress: Any = None
                  ) -> GenPPLResult:
    """Generation perplexity and unigram entropy of `texts` under `evaluator` (module docstring)."""
    if evaluator.context < 2:
        raise AOGPTError(f"evaluator context {evaluator.context} is too short", "use a real language model")
    seqs = [sample_tokens(evaluator, t) for t in texts]
    width = evaluator.context - 1
    windows = [(s, k) for s, ids in enumerate(seqs) for k in range(0, len(ids), width)]
    windows.sort(key=lambda w: -min(width, len(seqs[w[0]]) - w[1]))  # similar lengths share a batch
    sums = [0.0] * len(seqs)
    for b0 in range(0, len(windows), batch_size):
        group = windows[b0:b0 + batch_size]
        chunks = [seqs[s][k:k + width] for s, k in group]
        L = max(len(c) for c in chunks) + 1
        idx = torch.full((len(group), L), evaluator.eos_id, dtype=torch.long)
        mask = torch.zeros(len(group), L - 1, dtype=torch.bool)
        for r, c in enumerate(chunks):
            idx[r, 1:len(c) + 1] = torch.tensor(c)
            mask[r, :len(c)] = True
        nll = evaluator.nll(idx.to(evaluator.device)).double().cpu().masked_fill(~mask, 0.0).sum(1)
        for (s, _), v in zip(group, nll.tolist(), strict=True):
            sums[s] += v
        if progress is not None:
            progress.update(len(group))
    tokens = sum(len(s) for s in seqs)
    if tokens == 0:
        raise AOGPTError("every sample is empty", "generate non-empty samples")
    nonempty = [s for s in seqs if s]
    ent = [unigram_entropy([t for t in s if t != evaluator.eos_id]) for s in nonempty]
    nll = sum(sums) / tokens
    per_sample = [v / max(len(s), 1) for v, s in zip(sums, seqs, strict=True)]
    return GenPPLResult(genppl=math.exp(nll), nll=nll, tokens=tokens, samples=len(seqs),
                        empty_samples=len(seqs) - len(nonempty), entropy=sum(ent) / len(ent),
                        evaluator=evaluator.name, per_sample_nll=per_sample)


def generate_texts(loaded: Any, num_samples: int, seed: int, **kwargs: Any) -> list[str]:
    """Samples from a loaded checkpoint, decoded to text (via `aogpt.generation.generate.generate`)."""
    if loaded.tokenizer is None:
        raise AOGPTError("the checkpoint has no tokenizer to decode samples with", "use a checkpoint trained by aogpt")
    result = loaded.generate(num_samples=num_samples, seed=seed, return_text=True, **kwargs)
    return list(result.texts)
