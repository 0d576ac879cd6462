"""Where training starts on the target pathway: options that change the initial weights only.

The paper's AO-GPT starts adaLN-Zero: every modulation layer is zero, so each block is the identity
and the target position has no effect until the modulation grows. These options change that start
(`TrainConfig.init_*`) and never the model's forward function, so a trained or loaded model is the
same model whatever it started from. docs/training.md says what each did in the measured sweep.
"""

from __future__ import annotations

import torch
from torch import nn

from aogpt.config import TrainConfig
from aogpt.errors import AOGPTError


def applies(cfg: TrainConfig) -> bool:
    return cfg.init_target_std > 0 or cfg.init_modulation_std > 0 or cfg.init_open_gates


@torch.no_grad()
def init_target_pathway(model: nn.Module, cfg: TrainConfig) -> None:
    """Re-draw the target pathway of a freshly built `Transformer` as `cfg` asks (no-op by default):
    target tables with std `init_target_std`, adaLN weights with std `init_modulation_std`, adaLN
    gates opened (their bias 1: each block's attention and MLP pass through at full strength)."""
    if not applies(cfg):
        return
    pathway = model.target_pathway()
    if not pathway:
        raise AOGPTError(f"variant {model.config.variant} has no target pathway to initialise",
                         "drop the init_target_std / init_modulation_std / init_open_gates settings")
    adaptive = any("adaLN" in name for name in pathway)
    if (cfg.init_modulation_std > 0 or cfg.init_open_gates) and not adaptive:
        raise AOGPTError(f"a model with target injection {model.config.target!r} has no adaLN modulation",
                         "use init_target_std only, or target adaln")
    for name, p in pathway.items():
        if "wtpe" in name and cfg.init_target_std > 0:
            p.normal_(0.0, cfg.init_target_std)
        elif "adaLN" in name and name.endswith("weight") and cfg.init_modulation_std > 0:
            p.normal_(0.0, cfg.init_modulation_std)
    if cfg.init_open_gates:
        d = model.config.n_embd
        for block in model.transformer.h:  # rows of adaLN: shift, scale, gate (attention), then the MLP's
            bias = block.adaLN[-1].bias
            bias[2 * d:3 * d] = 1.0
            bias[5 * d:6 * d] = 1.0
