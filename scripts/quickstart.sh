#!/usr/bin/env bash
# The main job: install, prepare Shakespeare, train AO-GPT with the quickstart recipe (chosen by the
# sweep in docs/training.md) for at most QUICKSTART_MINUTES, evaluate it in bits per byte, print a
# left-to-right sample, a random-order sample and an infilling, and a generation speed table.
# Re-runnable: every run writes a new run directory under runs/.
#
# Settings (environment variables):
#   QUICKSTART_PRESET      training preset (default auto: the quickstart recipe with the model sized to the
#                          compute this machine gives the budget; quickstart: the fixed width-192 model)
#   QUICKSTART_MINUTES     time limit of the training (default 10)
#   QUICKSTART_CORPUS      what `aogpt prepare --corpus` reads (default shakespeare; a .txt file works)
#   QUICKSTART_TOKENIZER   tokenizer of the prepared data (default bpe:512)
#   QUICKSTART_DATA        prepared data directory (default data/<corpus>-<tokenizer>)
#   QUICKSTART_RUN         run directory (default runs/quickstart-<time>)
#   QUICKSTART_SEED        seed of training and sampling (default 1337)
#   QUICKSTART_SAMPLES     samples of each kind (default 8; the first 2 are shown, their words checked)
#   QUICKSTART_PASSAGE     the infilling passage, hidden words [[like this]] (default: Hamlet, 117 bpe:512 tokens)
#   QUICKSTART_TRAIN_FLAGS extra flags for `aogpt train` (e.g. "--max-steps 300")
#   QUICKSTART_BENCH_FLAGS flags of the speed table (`aogpt bench generate`)
#   QUICKSTART_PYTHON      use this Python (with aogpt importable) instead of installing .venv
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${QUICKSTART_PYTHON:-}" ]; then
  PY=$QUICKSTART_PYTHON
  COMMAND="$PY -m aogpt"
else
  bash scripts/install.sh
  PY=.venv/bin/python
  COMMAND=.venv/bin/aogpt
fi
aogpt() { "$PY" -m aogpt "$@"; }
PRESET=${QUICKSTART_PRESET:-auto}
MINUTES=${QUICKSTART_MINUTES:-10}
CORPUS=${QUICKSTART_CORPUS:-shakespeare}
TOKENIZER=${QUICKSTART_TOKENIZER:-bpe:512}
DATA=${QUICKSTART_DATA:-data/$(basename "${CORPUS%.*}")-${TOKENIZER/:/}}
RUN=${QUICKSTART_RUN:-runs/quickstart-$(date +%Y%m%d-%H%M%S)}
SEED=${QUICKSTART_SEED:-1337}
read -r -a TRAIN_FLAGS <<< "${QUICKSTART_TRAIN_FLAGS:-}"
read -r -a BENCH_FLAGS <<< "${QUICKSTART_BENCH_FLAGS:---n 128,512 --steps n,n/8 --repeats 3 --threads 1 --methods aogpt,encoder,gpt --encoder-limit 8}"
SAMPLES=${QUICKSTART_SAMPLES:-8}
# one token per step (exact); 8 samples of each kind, the first 2 shown, and the share of their words that are
# words of the training text
SAMPLING=(--policy count --temperature 0.8 --top-p 0.9 --seed "$SEED" --no-progress -n "$SAMPLES" --show 2
          --word-check "$DATA")

if [ -t 1 ]; then BOLD=$'\033[1m' PLAIN=$'\033[0m'; else BOLD="" PLAIN=""; fi  # no escape codes in logs
step() { printf '\n%s== %s%s\n' "$BOLD" "$*" "$PLAIN"; }

step "1/5 prepare: $CORPUS, tokenizer $TOKENIZER -> $DATA"
if [ "$CORPUS" = shakespeare ]; then
  echo "38 plays; Hamlet, The Tempest and Julius Caesar are held out for validation"
fi
if [ -f "$DATA/meta.json" ]; then
  echo "already prepared: $DATA (delete it to rebuild)"
else
  aogpt prepare --corpus "$CORPUS" --tokenizer "$TOKENIZER" --out "$DATA"
fi

step "2/5 train: AO-GPT, preset $PRESET, at most $MINUTES minutes -> $RUN"
mkdir -p "$RUN"
# The last stdout line of --json is the run's summary: kept for the closing line, not shown.
aogpt train --preset "$PRESET" --variant aogpt --data "$DATA" --out "$RUN" --max-minutes "$MINUTES" \
  --seed "$SEED" --json "${TRAIN_FLAGS[@]}" | while IFS= read -r line; do
  case $line in
    '{'*) printf '%s\n' "$line" > "$RUN/train-summary.json" ;;
    *) printf '%s\n' "$line" ;;
  esac
done

step "3/5 evaluate the EMA weights on the whole held-out text (lower is better; bits per byte compare across tokenizers)"
echo "(the validation that training printed read only its first batches; these figures are the model's)"
aogpt eval --checkpoint "$RUN" --data "$DATA" --order l2r,random --num-orders 1 --seed "$SEED" --json \
  | while IFS= read -r line; do
      case $line in
        '{'*) printf '%s\n' "$line" > "$RUN/eval-summary.json" ;;
        *) printf '%s\n' "$line" ;;
      esac
    done

step "4/5 samples from the EMA weights (one token per step, temperature 0.8, top-p 0.9; 2 of $SAMPLES shown)"
echo "-- left to right: one token per step, each drawn given the tokens before it, as a GPT generates --"
aogpt sample --checkpoint "$RUN" --order l2r "${SAMPLING[@]}"
echo
echo "-- random order: the same model reveals positions in a random order, each token drawn given the"
echo "   tokens revealed so far, wherever they are (any-order generation, with the KV cache) --"
aogpt sample --checkpoint "$RUN" --order random "${SAMPLING[@]}"
echo
echo "-- infilling: a held-out passage (Hamlet is not trained on) with five spans of 5-10 tokens hidden inside its"
echo "   lines; each fill sees the text on both sides and is drawn left to right inside its gap --"
PASSAGE=${QUICKSTART_PASSAGE:-"HAMLET:
To be, or not to be:[[ that is the question]]:
Whether 'tis nobler in the mind[[ to suffer]]
The slings and arrows of[[ outrageous fortune]],
Or[[ to take arms]] against a sea of troubles,
And by[[ opposing end them]]? To die: to sleep;"}
aogpt sample --checkpoint "$RUN" --infill "$PASSAGE" "${SAMPLING[@]}"

step "5/5 speed: AO-GPT with its KV cache against an encoder-only masked diffusion model and a left-to-right GPT"
echo "n = 128 and 512 tokens, T = n and n/8 steps, one thread, medians of 3 interleaved runs (the encoder estimated"
echo "where a run would take over 8 s). The decoder's advantage grows with n: over T steps an encoder evaluates"
echo "T x n slots, AO-GPT with its KV cache about 2n whatever T (the paper's Finding 7); with T = n or n/8 the gap"
echo "grows in proportion to n, so it is wider at n = 512 than at n = 128."
aogpt bench generate "${BENCH_FLAGS[@]}" --out "$RUN/bench" --no-progress

echo
"$PY" - "$RUN" "$PRESET" "$CORPUS" "$TOKENIZER" "$COMMAND" <<'EOF'
import json, sys
from pathlib import Path

run, preset, corpus, tokenizer, command = sys.argv[1:]
s = json.loads((Path(run) / "train-summary.json").read_text())
evaluated = Path(run) / "eval-summary.json"  # the whole held-out text, as printed in step 3
rows = json.loads(evaluated.read_text())["results"] if evaluated.is_file() else []
bpb = next((r.get("bpb") for r in rows if r.get("order") == "l2r"), None)
anyo = next((r.get("bpb") for r in rows if r.get("order") == "random"), None)
reached = f", {bpb:.2f} bits/byte left to right" if bpb is not None else ""
reached += f" and {anyo:.2f} in a random order" if anyo is not None else ""
reached += " on the held-out text" if reached else ""
early = "" if s.get("ended_as_planned", s["stopped_by"] != "time") else \
    " (cut short by the time limit: QUICKSTART_MINUTES=20 gives it more)"
print(f"Done: AO-GPT (preset {preset}) trained {s['step']:,} of {s['planned_steps']:,} steps on {corpus} "
      f"({tokenizer}){early}{reached}. Run: {run} (loss plot {s.get('plot') or run + '/loss.png'}, speed table "
      f"{run}/bench/generate.md). Next: {command} sample --checkpoint {run} --prompt 'ROMEO:'")
EOF
