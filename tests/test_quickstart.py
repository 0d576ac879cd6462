"""scripts/quickstart.sh end to end at a tiny budget: a tiny model on a small local text, a time limit
that cuts training short, heartbeat lines in a log, bits per byte, the three kinds of samples, the
speed table and the closing line. No network: the script uses this interpreter instead of installing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quickstart_end_to_end_tells_the_truth(tmp_path, make_corpus):
    corpus = make_corpus(tmp_path / "corpus", docs=1, words=4000) / "doc00.txt"  # ~24 KB, 5 % held out
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "OMP_NUM_THREADS": "1",
        "AOGPT_HEARTBEAT_SECONDS": "0.2",
        "QUICKSTART_PYTHON": sys.executable,
        "QUICKSTART_PRESET": "tiny",
        "QUICKSTART_MINUTES": "0.02",  # 1.2 s of training: far fewer than the 100,000 steps planned
        "QUICKSTART_CORPUS": str(corpus),
        "QUICKSTART_TOKENIZER": "bytes",
        "QUICKSTART_DATA": str(tmp_path / "data"),
        "QUICKSTART_RUN": str(tmp_path / "run"),
        # a train record (and so the heartbeat's foresight) every step: on a busy machine 1.2 s may hold
        # fewer steps than the preset's log interval
        "QUICKSTART_TRAIN_FLAGS": "--max-steps 100000 --block-size 96 --set log_interval=1",
        "QUICKSTART_BENCH_FLAGS": "--quick --methods aogpt,encoder,gpt",
        "QUICKSTART_PASSAGE": "HAMLET:\nTo be, or not to be:[[ that is the]] question:",  # fits 96 bytes
    }
    done = subprocess.run(["bash", str(ROOT / "scripts" / "quickstart.sh")], env=env, capture_output=True, text=True,
                          timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    lines = out.splitlines()
    # heartbeat lines (stderr is not a terminal): steps of planned, an ETA, the time limit foreseen
    beats = [line for line in lines if line.startswith("train: ")]
    assert beats and all("/100,000 steps" in b and "ETA" in b for b in beats[:-1]), beats
    assert any("time limit: about" in b for b in beats), beats
    # the truncation is said, with the steps done and what it means
    assert any(line.startswith("time limit of 0.02 minutes reached after") for line in lines)
    warning = next(line for line in lines if line.startswith("warning: the time limit"))
    assert "of 100,000 planned steps" in warning and "samples will be poor" in warning
    # bits per byte beside perplexity: the training summary and the evaluation
    assert any("left to right, ema weights: loss" in line and "bits/byte" in line for line in lines)
    assert any("order=l2r" in line and "bits/byte" in line for line in lines)
    assert any("order=random" in line and "bits/byte" in line for line in lines)
    # which held-out figure is which: training's validation names how much it read, step 3 reads it all
    heading = next(line for line in lines if line.startswith("validation on the "))
    scored = next(line for line in lines if "order=l2r" in line).split("tokens ")[1].split()[0]
    whole = f"of the held-out text's {int(scored):,} tokens"
    assert (heading.startswith("validation on the first ") and whole in heading
            or heading == f"validation on the whole held-out text ({int(scored):,} tokens):"), heading
    assert any(line.startswith("== 3/5 evaluate the EMA weights on the whole held-out text") for line in lines)
    # three samples, each labelled with how it was made
    for label in ("-- left to right:", "-- random order:", "-- infilling:"):
        assert any(line.startswith(label) for line in lines), label
    assert "original:\nHAMLET:\nTo be, or not to be: that is the question:" in out
    assert "order l2r" in out and "order random" in out and "infilling: left to right inside each gap" in out
    assert out.count("(count, linear)") == 3  # one token per step: each sample follows the model's own law
    # 8 samples of each kind, 2 shown, and the share of their words found in the training text
    assert out.count("--- sample 1 of 8 ---") == 2 and out.count("--- sample 3 of 8 ---") == 0
    assert out.count("fill 1 of 8:") == 1 and out.count("fill 3 of 8:") == 0
    assert sum(line.startswith("words in all 8 samples: ") and "occur in the training text" in line
               for line in lines) == 2
    assert any(line.startswith("words in the filled words of all 8 samples: ") for line in lines)
    assert any(line.startswith("hidden words: ") and "bits/byte (exact" in line for line in lines)
    # the speed table in users' words, and the closing line
    assert "# Generation speed" in out and "What this run shows:" in out and "issue" not in out.lower()
    closing = done.stdout.splitlines()[-1]
    assert closing.startswith("Done: AO-GPT (preset tiny) trained") and "cut short by the time limit" in closing
    assert "bits/byte left to right" in closing and str(tmp_path / "run") in closing
    # the closing line quotes the evaluation of the whole held-out text printed above, not another figure
    evaluated = next(line for line in lines if "order=l2r" in line).split("bits/byte ")[1].split()[0]
    assert f"{float(evaluated):.2f} bits/byte left to right" in closing
    evaluated = next(line for line in lines if "order=random" in line).split("bits/byte ")[1].split()[0]
    assert f"and {float(evaluated):.2f} in a random order on the held-out text" in closing
    assert "sample --checkpoint" in closing
    assert (tmp_path / "run" / "loss.png").is_file() and (tmp_path / "run" / "bench" / "generate.md").is_file()
