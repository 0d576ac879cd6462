"""The paper's released checkpoints: read (and write) the reference implementation's ``.pt`` format.

The authors released AO-GPT and sigma-GPT checkpoints as nanoGPT-style dictionaries::

    {"model": state dict (raw weights), "ema_model": {"decay", "num_updates", "shadow_params"},
     "ema_rate", "optimizer", "model_args": {n_layer, n_head, n_embd, block_size, bias, vocab_size,
     dropout}, "iter_num", "config": training-script globals}

Our `Transformer` uses the reference's parameter names and `parameters()` order, so a conversion is a
renaming-free copy, but every step is checked: the file is read with ``weights_only=True``, the
architecture is detected from the keys, the config is derived from the tensor shapes (and
cross-checked against ``model_args``), and every key and shape is compared with the model that
config builds, naming each mismatch. ``shadow_params`` (the EMA weights) is an unnamed list in
``parameters()`` order: one entry per *distinct* parameter, so sigma-GPT's tied head appears once,
at the ``wte`` position.

`read_reference` parses a file; `load_reference` gives a ready model (`aogpt.reference.convert`
writes our checkpoints from them and back). docs/checkpoints.md describes the commands.
"""

from __future__ import annotations

import pickle
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aogpt.config import ModelConfig, model_config
from aogpt.errors import AOGPTError
from aogpt.families import family
from aogpt.model import Transformer

COMPILED_PREFIX = "_orig_mod."  # torch.compile'd models save their keys under this prefix
NORM_EPS = 1e-5  # RMSNorm / LayerNorm epsilon of the reference code
MODEL_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")
PAPER_EMA_DECAY = 0.9999
GPT2_VOCABS = (50257, 50304)  # GPT-2's vocabulary, and nanoGPT's padded one
# nanoGPT's causal-mask buffers (saved by its non-flash attention path): not weights, dropped.
_MASK_BUFFER = re.compile(r"^transformer\.h\.\d+\.attn\.(masked_)?bias$")
ARCH_NAMES = {"aogpt": "AO-GPT", "sigma": "sigma-GPT"}
Stage = Callable[[str], None]


@dataclass
class ReferenceCheckpoint:
    """A parsed reference checkpoint: the raw state dict, the EMA (if any) and the derived config."""

    path: Path
    variant: str  # "aogpt" or "sigma"
    config: ModelConfig
    state: dict[str, torch.Tensor]  # raw weights, `_orig_mod.` stripped, mask buffers dropped
    ema: dict[str, torch.Tensor] | None  # EMA weights by parameter name (tied head: once, as wte)
    ema_decay: float | None = None
    ema_num_updates: int | None = None
    iter_num: int = 0
    model_args: dict[str, Any] = field(default_factory=dict)
    extra_config: dict[str, Any] = field(default_factory=dict)  # the training script's globals
    ignored_keys: list[str] = field(default_factory=list)

    def weights(self, which: str) -> dict[str, torch.Tensor]:
        """The full state dict for `which` ("ema" or "raw"); EMA entries override the raw ones."""
        if which == "ema" and self.ema is None:
            raise AOGPTError(f"{self.path} has no EMA weights (no `ema_model` entry)", "pass --weights raw")
        state = {**self.state, **self.ema} if which == "ema" else dict(self.state)
        if self.config.tie_head:  # the head is wte (the EMA lists it once, at the wte position)
            state["lm_head.weight"] = state["transformer.wte.weight"]
        return state


def check_weights(which: str, choices: tuple[str, ...]) -> None:
    if which not in choices:
        raise AOGPTError(f"unknown weights {which!r}", f"choose one of: {', '.join(choices)}")


# ---------------------------------------------------------------------------------------------- reading
def _torch_load(path: Path) -> Any:
    """`torch.load` with ``weights_only=True``, every failure turned into a user error."""
    if not path.is_file():
        raise AOGPTError(f"{path} {'is not a file' if path.exists() else 'does not exist'}", "check the path")
    with open(path, "rb") as f:
        head = f.read(4)
    # torch.save writes a zip archive; the legacy format (and plain pickles) start with PROTO 0x80.
    fix = "pass the reference checkpoint's .pt file"
    if head != b"PK\x03\x04" and not head.startswith(b"\x80"):
        raise AOGPTError(f"{path} is not a PyTorch checkpoint (neither a torch zip archive nor a pickle)", fix)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about pickle protocols before failing
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError, RuntimeError, EOFError, ... for foreign or truncated files
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        refused = next((ln for ln in lines if "Unsupported global" in ln), None)
        if isinstance(exc, pickle.UnpicklingError) and refused:
            what = refused.split("Unsupported global:")[-1].split(" was not")[0].strip()
            raise AOGPTError(
                f"{path} holds pickled objects other than tensors and plain containers ({what})",
                "refused for safety (weights_only); re-save it with tensors, dicts, lists and numbers only",
            ) from None
        skip = ("Weights only", "In PyTorch", "Please", "Check the", "(")
        detail = next((ln for ln in lines if not ln.startswith(skip)), type(exc).__name__).split(". ")[0]
        raise AOGPTError(
            f"{path} is not a readable PyTorch checkpoint ({detail})", fix + "; it may be truncated"
        ) from None


def _clean_state(raw: Any, path: Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Tensors by name, `_orig_mod.` prefixes stripped and causal-mask buffers set aside."""
    if not isinstance(raw, dict) or not raw:
        raise AOGPTError(f"{path}: `model` is not a non-empty state dict", "pass a reference checkpoint")
    state, ignored = {}, []
    for key, value in raw.items():
        name = str(key)
        while name.startswith(COMPILED_PREFIX):
            name = name[len(COMPILED_PREFIX) :]
        if not isinstance(value, torch.Tensor):
            raise AOGPTError(f"{path}: model entry {name} is a {type(value).__name__}, not a tensor", "fix the file")
        if _MASK_BUFFER.match(name) and value.dim() == 4:
            ignored.append(name)
        elif name in state:
            raise AOGPTError(f"{path}: key {name} appears twice (with and without {COMPILED_PREFIX})", "fix the file")
        else:
            state[name] = value
    return state, ignored


def _dims(state: dict[str, torch.Tensor], key: str, ndim: int) -> tuple[int, ...] | None:
    t = state.get(key)
    return tuple(t.shape) if t is not None and t.dim() == ndim else None


def detect_architecture(state: dict[str, torch.Tensor]) -> str:
    """ "aogpt" or "sigma", from the keys (and sigma's n_embd-wide target table)."""
    ao = sorted(k for k in state if k.startswith("transformer.final_layer.") or ".adaLN." in k or ".attn.q_norm." in k)
    wte, wtpe = _dims(state, "transformer.wte.weight", 2), _dims(state, "transformer.wtpe.weight", 2)
    sigma = "transformer.ln_f.weight" in state and wte is not None and wtpe is not None and wtpe[1] == wte[1]
    if ao and not sigma:
        return "aogpt"
    if sigma and not ao:
        return "sigma"
    if ao:
        why = f"it mixes AO-GPT keys ({ao[0]}) with sigma-GPT's transformer.ln_f"
    elif wtpe is None:
        why = "it has no target-position table transformer.wtpe.weight (a left-to-right GPT-2?)"
    elif wte is not None:
        why = f"transformer.wtpe.weight is {wtpe[1]} wide, not n_embd {wte[1]}"
    else:
        why = "neither AO-GPT nor sigma-GPT keys were found"
    raise AOGPTError(
        f"unknown architecture: {why}",
        "expected AO-GPT (transformer.final_layer.*, *.adaLN.1.*, attn.q_norm) or sigma-GPT "
        "(transformer.ln_f.*, an n_embd-wide transformer.wtpe.weight)",
    )


def reference_config(
    state: dict[str, torch.Tensor], model_args: dict[str, Any] | None = None, variant: str | None = None
) -> ModelConfig:
    """The `ModelConfig` a reference state dict describes: shapes first, `model_args` cross-checked.

    vocab and n_embd come from wte; block_size from wpe (rows - 1) or wtpe; n_layer from the block
    indices; n_head from q_norm (AO-GPT) or model_args (sigma-GPT); target_dim from wtpe's width.
    """
    args = dict(model_args or {})
    variant = variant or detect_architecture(state)
    incomplete = "pass a complete checkpoint"
    wte = _dims(state, "transformer.wte.weight", 2)
    if wte is None:
        raise AOGPTError("missing tensor transformer.wte.weight (or it is not 2-D)", incomplete)
    wpe, wtpe = _dims(state, "transformer.wpe.weight", 2), _dims(state, "transformer.wtpe.weight", 2)
    block = wpe[0] - 1 if wpe else wtpe[0] if wtpe else args.get("block_size")
    if not isinstance(block, int):
        raise AOGPTError("cannot tell the block size (no wpe/wtpe, no model_args.block_size)", incomplete)
    layers = {int(m.group(1)) for k in state if (m := re.match(r"transformer\.h\.(\d+)\.", k))}
    if not layers:
        raise AOGPTError("no transformer blocks (transformer.h.*) in the state dict", incomplete)
    bias = "transformer.h.0.attn.c_attn.bias" in state
    derived = dict(n_layer=max(layers) + 1, n_embd=wte[1], block_size=block, vocab_size=wte[0], bias=bias)
    q_norm = _dims(state, "transformer.h.0.attn.q_norm.weight", 1)
    if variant == "aogpt" and q_norm and q_norm[0] and wte[1] % q_norm[0] == 0:
        derived["n_head"] = wte[1] // q_norm[0]
    elif "n_head" in args:
        derived["n_head"] = args["n_head"]
    else:
        raise AOGPTError("cannot tell the number of heads: model_args has no n_head", "add it to model_args")
    for key, value in derived.items():
        if key in args and args[key] != value:
            raise AOGPTError(
                f"model_args says {key}={args[key]!r} but the tensors say {value!r}",
                "the checkpoint is inconsistent; fix model_args",
            )
    if variant == "aogpt":
        derived.update(target_dim=wtpe[1] if wtpe else 128, head_bias="lm_head.bias" in state)
    return model_config(variant, **derived, dropout=0.0, norm_eps=NORM_EPS)


def reference_incompatibilities(cfg: ModelConfig) -> list[str]:
    """Why `cfg` is not one of the reference architectures (empty if it is). Sizes are free."""
    if cfg.variant not in ARCH_NAMES:
        return [f"variant {cfg.variant} (the reference format holds aogpt and sigma only)"]
    expected = dict(family(cfg.variant).architecture, norm_eps=NORM_EPS)
    if cfg.variant == "aogpt":
        expected.pop("head_bias")  # the head's bias shows in the keys; both forms round-trip
    return [f"{k}={getattr(cfg, k)!r} (the reference uses {v!r})" for k, v in expected.items() if getattr(cfg, k) != v]


def meta_model(cfg: ModelConfig) -> Transformer:
    """The model's structure without allocating its weights."""
    with torch.device("meta"):
        return Transformer(cfg)


def check_state(state: dict[str, torch.Tensor], cfg: ModelConfig, where: str) -> None:
    """Compare every key and shape with the model `cfg` builds; raise naming each mismatch."""
    expected = {k: tuple(v.shape) for k, v in meta_model(cfg).state_dict().items()}
    optional = {"lm_head.weight"} if cfg.tie_head else set()
    problems = {
        "missing": [k for k in expected if k not in state and k not in optional],
        "unexpected": [k for k in state if k not in expected],
        "wrong shape": [
            f"{k} {tuple(state[k].shape)} (expected {v})"
            for k, v in expected.items()
            if k in state and tuple(state[k].shape) != v
        ],
    }
    parts = [
        f"{label}: {', '.join(items[:8])}" + (f" and {len(items) - 8} more" if len(items) > 8 else "")
        for label, items in problems.items()
        if items
    ]
    name = ARCH_NAMES.get(cfg.variant, cfg.variant)
    if parts:
        raise AOGPTError(
            f"{where} does not match {name} ({cfg.n_layer} layers, n_embd {cfg.n_embd}): {'; '.join(parts)}",
            "the file is incomplete or from another architecture",
        )
    head = state.get("lm_head.weight") if cfg.tie_head else None
    if head is not None and not torch.equal(head, state["transformer.wte.weight"]):
        raise AOGPTError(f"{where}: lm_head.weight differs from transformer.wte.weight, but {name} ties them", "")


def parameter_names(cfg: ModelConfig) -> list[str]:
    """Names of the distinct parameters in `parameters()` order: the order of ``shadow_params``."""
    return [name for name, _ in meta_model(cfg).named_parameters()]


def _read_ema(entry: Any, cfg: ModelConfig, path: Path) -> tuple[dict[str, torch.Tensor], float | None, int | None]:
    """Name the unnamed ``shadow_params`` list by our `parameters()` order, checking count and shapes."""
    shadow = entry.get("shadow_params") if isinstance(entry, dict) else None
    if not isinstance(shadow, list | tuple) or not all(isinstance(t, torch.Tensor) for t in shadow):
        raise AOGPTError(f"{path}: ema_model has no shadow_params list of tensors", "pass --weights raw")
    shapes = {k: tuple(p.shape) for k, p in meta_model(cfg).named_parameters()}
    if len(shadow) != len(shapes):
        raise AOGPTError(
            f"{path}: ema_model.shadow_params holds {len(shadow)} tensors, but "
            f"{ARCH_NAMES[cfg.variant]} has {len(shapes)} parameters",
            "pass --weights raw",
        )
    ema = dict(zip(shapes, shadow, strict=True))
    bad = [
        f"#{i} {k} {tuple(t.shape)} (expected {shapes[k]})"
        for i, (k, t) in enumerate(ema.items())
        if tuple(t.shape) != shapes[k]
    ]
    if bad:
        raise AOGPTError(f"{path}: EMA shadow_params have wrong shapes: {', '.join(bad[:8])}", "pass --weights raw")
    decay, updates = entry.get("decay"), entry.get("num_updates")
    decay = float(decay) if isinstance(decay, int | float) else None
    return ema, decay, updates if isinstance(updates, int) else None


def plain_value(value: Any) -> Any:
    """JSON-safe copy of informational metadata: tensors and other objects are dropped."""
    if isinstance(value, dict):
        return {str(k): plain_value(v) for k, v in value.items() if _is_plain(v)}
    if isinstance(value, list | tuple):
        return [plain_value(v) for v in value if _is_plain(v)]
    return value


def _is_plain(value: Any) -> bool:
    return value is None or isinstance(value, dict | list | tuple | bool | int | float | str)


def read_reference(path: str | Path, need_ema: bool = False) -> ReferenceCheckpoint:
    """Parse and check a reference checkpoint file (without building the model)."""
    path = Path(path)
    obj = _torch_load(path)
    if not isinstance(obj, dict):
        raise AOGPTError(f"{path} holds a {type(obj).__name__}, not a checkpoint dict", "pass a reference .pt file")
    if "model" not in obj:
        keys = ", ".join(map(str, list(obj)[:6])) or "none"
        raise AOGPTError(
            f"{path} has no `model` state dict (top-level keys: {keys})",
            "pass a reference checkpoint (nanoGPT style: model, ema_model, model_args, ...)",
        )
    state, ignored = _clean_state(obj["model"], path)
    args = obj.get("model_args") or {}
    if not isinstance(args, dict):
        raise AOGPTError(f"{path}: model_args is a {type(args).__name__}, not a dict", "fix the file")
    variant = detect_architecture(state)
    cfg = reference_config(state, args, variant)
    check_state(state, cfg, where=str(path))
    ema, decay, updates = None, None, None
    if obj.get("ema_model") is not None:
        ema, decay, updates = _read_ema(obj["ema_model"], cfg, path)
    elif need_ema:
        raise AOGPTError(f"{path} has no EMA weights (no `ema_model` entry)", "pass --weights raw")
    if decay is None and isinstance(obj.get("ema_rate"), int | float):
        decay = float(obj["ema_rate"])
    iter_num = obj.get("iter_num")
    extra = obj.get("config")
    return ReferenceCheckpoint(
        path=path,
        variant=variant,
        config=cfg,
        state=state,
        ema=ema,
        ema_decay=decay,
        ema_num_updates=updates,
        iter_num=iter_num if isinstance(iter_num, int) else 0,
        model_args=plain_value(args),
        extra_config=plain_value(extra) if isinstance(extra, dict) else {},
        ignored_keys=ignored,
    )


def build_model(ref: ReferenceCheckpoint, which: str, dtype: torch.dtype = torch.float32) -> Transformer:
    model = Transformer(ref.config)
    model.load_state_dict(ref.weights(which), strict=True)
    return model.to(dtype=dtype).eval()


def load_reference(
    path: str | Path, weights: str = "ema", dtype: torch.dtype = torch.float32
) -> tuple[Transformer, ModelConfig]:
    """A reference checkpoint as a ready model (eval mode) and its config; EMA weights by default."""
    check_weights(weights, ("ema", "raw"))
    ref = read_reference(path, need_ema=weights == "ema")
    return build_model(ref, weights, dtype), ref.config
