#!/usr/bin/env bash
# The main job: install, prepare Shakespeare, train AO-GPT cpu-small for a fixed time budget,
# report validation perplexities, print samples and an infilling example, and a speed table.
# Re-runnable: every run writes a new run directory under runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
A=".venv/bin/aogpt"
DATA=${QUICKSTART_DATA:-data/shakespeare-bpe4096}
RUN=${QUICKSTART_RUN:-runs/quickstart-$(date +%Y%m%d-%H%M%S)}
MINUTES=${QUICKSTART_MINUTES:-10}
PRESET=${QUICKSTART_PRESET:-cpu-small}
SEED=${QUICKSTART_SEED:-1337}

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1/5 prepare: Shakespeare (38 plays; Hamlet, The Tempest, Julius Caesar held out) -> $DATA"
if [ -f "$DATA/meta.json" ]; then
  echo "already prepared: $DATA (delete it to rebuild)"
else
  $A prepare --corpus shakespeare --tokenizer bpe:4096 --out "$DATA"
fi

step "2/5 train: AO-GPT $PRESET (850 steps, capped at $MINUTES minutes) -> $RUN"
$A train --preset "$PRESET" --variant aogpt --data "$DATA" --out "$RUN" --max-minutes "$MINUTES" --seed "$SEED"

step "3/5 evaluate the EMA weights on the held-out plays"
$A eval --checkpoint "$RUN" --data "$DATA" --order l2r --max-batches 40
$A eval --checkpoint "$RUN" --data "$DATA" --order random --num-orders 4 --max-batches 10

step "4/5 samples (EMA weights, KV cache, Lemma 4.1 Bernoulli unmasking)"
echo "settings: 3 samples, 96 tokens, 48 steps, temperature 0.8, top-p 0.9, random order, seed $SEED"
$A sample --checkpoint "$RUN" --num-samples 3 --length 96 --steps 48 --temperature 0.8 --top-p 0.9 --seed "$SEED"
echo
echo "infilling (each [MASK:k] is k tokens; the given text is never changed):"
$A sample --checkpoint "$RUN" --infill "HAMLET:
To be, or not to be, [MASK:12]
[MASK:16]
OPHELIA:
[MASK:10]" --steps 19 --temperature 0.8 --top-p 0.9 --seed "$SEED"

step "5/5 speed: decoder with KV cache vs encoder-only MDM (random weights, 4 x 256, n = 128, batch 8)"
$A bench generate --n 128 --steps 16,128 --repeats 1 --methods aogpt,encoder,gpt --out "$RUN/bench"

echo
echo "run directory: $RUN  (loss plot: $RUN/loss.png, metrics: $RUN/metrics.jsonl)"
