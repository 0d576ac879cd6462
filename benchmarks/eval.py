"""Evaluation speed, measured side by side in one process (medians over interleaved repeats).

* L2R evaluation tokens/s (`aogpt.evaluate.evaluate`, inference mode) against training tokens/s on the
  same model and batch (forward + backward + AdamW step, written here so the benchmark does not
  depend on the trainer). Target: evaluation >= 3x training.
* Random-order (any-order bound) evaluation tokens/s, for reference.
* Context-order ensembling: time per extra ensemble member per sequence, and that cost in units of
  one base forward of the sequence (a member needs one pass per step over the step's prefix).

Usage: python benchmarks/eval.py [--quick] [--device cpu|cuda] [--repeats R]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from aogpt.config import model_config
from aogpt.evaluate import evaluate
from aogpt.model import Transformer


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller model and fewer repeats (about a minute on CPU)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--members", type=int, default=4, help="ensemble size M for the per-member timing")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    if args.quick:
        size = dict(n_layer=2, n_head=4, n_embd=128, block_size=64, vocab_size=2048, target_dim=64)
        batch, repeats, ens_seqs = 8, args.repeats or 5, 1
    else:
        size = dict(n_layer=4, n_head=4, n_embd=256, block_size=128, vocab_size=4096, target_dim=128)
        batch, repeats, ens_seqs = 16, args.repeats or 7, 2
    if device.type == "cuda":
        size.update(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304)
        batch, ens_seqs = 8, 1
    model = Transformer(model_config("aogpt", **size)).to(device)
    n = size["block_size"]
    print(f"model: aogpt {size['n_layer']}x{size['n_embd']}, context {n}, vocab {size['vocab_size']}, "
          f"{model.num_params() / 1e6:.1f}M params; batch {batch}; device {device}; torch threads "
          f"{torch.get_num_threads()}")
    data = torch.randint(0, size["vocab_size"], (batch * 2, n), device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(0)

    def train_step() -> None:
        model.train()
        order = torch.rand(batch, n, generator=gen).argsort(1).to(device)
        loss = model(data[:batch], order)[1].mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def eval_l2r() -> None:
        evaluate(model, data, order="l2r", batch_size=batch)

    def eval_random() -> None:
        evaluate(model, data, order="random", num_orders=1, batch_size=batch)

    ens_data = data[:ens_seqs]

    def ens_base() -> None:
        evaluate(model, ens_data, order="random", num_orders=1, batch_size=ens_seqs)

    def ens_members() -> None:
        evaluate(model, ens_data, order="random", num_orders=1, ensemble=args.members, batch_size=ens_seqs)

    for fn in (train_step, eval_l2r, eval_random, ens_base, ens_members):  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in ("train", "l2r", "random", "base", "ens")}
    for _ in range(repeats):  # interleaved, so machine load hits every measurement alike
        times["train"].append(timed(train_step, device))
        times["l2r"].append(timed(eval_l2r, device))
        times["random"].append(timed(eval_random, device))
        times["base"].append(timed(ens_base, device))
        times["ens"].append(timed(ens_members, device))
    med = {k: statistics.median(v) for k, v in times.items()}
    train_tps = batch * n / med["train"]
    l2r_tps = data.numel() / med["l2r"]
    rnd_tps = data.numel() / med["random"]
    per_member = (med["ens"] - med["base"]) / (args.members - 1) / ens_seqs
    base_per_seq = med["base"] / ens_seqs
    print(f"training (fwd+bwd+AdamW)   {train_tps:12,.0f} tokens/s")
    print(f"eval l2r                   {l2r_tps:12,.0f} tokens/s   ratio eval/train = {l2r_tps / train_tps:.2f}x "
          f"(target >= 3x)")
    print(f"eval random order          {rnd_tps:12,.0f} tokens/s   ratio eval/train = {rnd_tps / train_tps:.2f}x")
    print(f"ensemble, per extra member {per_member * 1e3:12.1f} ms per sequence of {n} tokens "
          f"= {per_member / base_per_seq:.1f}x one base evaluation of that sequence (M={args.members})")
    print(f"(medians of {repeats} interleaved repeats)")


if __name__ == "__main__":
    main()
