"""`aogpt train` end to end: the flags reach the library's plan (`aogpt.train.plan`) unchanged, the run
trains, resumes and extends, and what goes wrong while training is one line and exit 2. The plan's
precedence rules and refusals are tested where they live (tests/train/test_planning.py), the one-line
form of each refusal in tests/cli/test_malformed.py."""

from __future__ import annotations

import json

from aogpt.checkpoint import list_checkpoints


def one_line_error(result, *fragments):
    assert result.code == 2, (result.out, result.err)
    lines = [line for line in result.err.strip().splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), result.err
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]


def test_help(cli):
    result = cli("train", "--help")
    assert result.code == 0 and "--preset" in result.out and "--resume" in result.out


def test_a_time_budgeted_run_says_how_its_steps_and_rate_are_decided(cli, bytes_data, tmp_path):
    result = cli("train", "--preset", "tiny", "--data", bytes_data, "--out", tmp_path / "run", "--max-minutes", "0.02",
                 "--max-steps", "1000000", "--set", "train.lr_schedule=wsd", "--set", "train.curriculum=l2r@3",
                 "--set", "train.log_interval=2", "--order", "uniform")
    assert result.code == 0, result.err
    assert "for 0.02 minutes (as many steps as fit, at most 1,000,000" in result.out
    assert "orders: l2r@3 (step@end), then uniform; learning rate: warm-up 5 steps to 0.003, constant, then a " \
           "linear decay to 0.0003 over the last 20% of the 0.02-minute budget" in result.out
    assert "the 0.02-minute budget holds about" in result.err and "decaying to 0.0003 over the next" in result.err
    done = next(line for line in result.out.splitlines() if line.startswith("trained aogpt"))
    steps, planned = done.split(" for ")[1].split(" planned steps")[0].split(" of ")
    assert int(steps.replace(",", "")) > 3
    if steps == planned:  # the run ended where its schedule said, not cut by the clock
        assert "warning" not in result.out
    else:  # a machine that slowed after the decay was fitted (another job's load): the run says which it was
        assert (f"warning: the time limit (0.02 minutes) stopped training after {steps} of {planned} " in result.out
                or "ended the run as planned, during its learning-rate decay" in result.out)


def test_train_json_summary_checkpoint_and_plot(cli, bytes_data, tmp_path):
    out = tmp_path / "run"
    result = cli("train", "--preset", "tiny", "--data", bytes_data, "--out", out, "--max-steps", "4",
                 "--no-progress", "--json")
    assert result.code == 0, result.err
    summary = result.json
    assert summary["step"] == 4 and summary["checkpoint"].endswith("ckpt-0000004")
    assert {"val/l2r/ema", "val/any/ema", "val/l2r/raw", "val/any/raw", "tokens_per_s"} <= set(summary)
    assert (out / "loss.png").is_file() and (out / "metrics.jsonl").is_file() and (out / "run.json").is_file()
    assert "perplexity" in result.out and "bits/byte" in result.out and "4 of 4 planned steps" in result.out
    assert result.out.startswith("training aogpt (2 layers, width 32, context 32) on 8 x 32 tokens a step for 4 steps")
    assert "orders: mixture:0.1; learning rate: warm-up 5 steps to 0.003, cosine decay to 0.0003 at step 4" \
        in result.out
    assert summary["bpb/l2r/ema"] > 0 and summary["planned_steps"] == 4 and summary["stopped_by"] == "max_steps"
    # the validation reads the first batches of the held-out text, and says so (`aogpt eval` reads it all)
    from aogpt.data import PreparedData

    scored, whole = summary["val_tokens"], summary["val_split_tokens"]
    assert scored == 2 * 8 * 32 and whole == PreparedData(bytes_data).num_tokens("val") // 32 * 32 > scored
    assert f"validation on the first {scored:,} of the held-out text's {whole:,} tokens (2 batches; aogpt eval " \
           "scores them all):" in result.out
    from aogpt.precision import auto_precision

    assert f"precision: {auto_precision('cpu')[1]} (fp32 weights and optimizer state)" in result.out
    assert "warning" not in result.out
    import aogpt

    loaded = aogpt.load(out)
    assert loaded.config.variant == "aogpt" and loaded.tokenizer.spec == "bytes" and loaded.step == 4
    assert loaded.config.vocab_size == 320  # bytes: 257 ids padded to a multiple of 64


def test_a_time_limit_that_cuts_the_run_short_is_said(cli, bytes_data, tmp_path):
    result = cli("train", "--preset", "tiny", "--data", bytes_data, "--out", tmp_path / "run", "--max-steps", "500",
                 "--max-minutes", "0.00001", "--json")
    assert result.code == 0, result.err
    s = result.json
    assert s["stopped_by"] == "time" and s["step"] < 500 and s["planned_steps"] == 500
    warning = next(line for line in result.out.splitlines() if line.startswith("warning:"))
    assert f"after {s['step']} of 500 planned steps" in warning and "samples will be poor" in warning
    assert "time limit of 1e-05 minutes reached" in result.err


def test_extend_to_keeps_the_schedule_and_equals_an_uninterrupted_run(cli, bytes_data, tmp_path):
    args = ("--preset", "tiny", "--data", bytes_data, "--no-progress", "--set", "train.eval_interval=3",
            "--set", "train.ckpt_interval=3", "--set", "log_interval=1", "--set", "train.warmup_steps=1")
    # the rule: the original cosine up to the old horizon (3), min_lr after it, as if schedule_steps=3
    assert cli("train", *args, "--out", tmp_path / "a", "--max-steps", "6", "--set", "train.schedule_steps=3").code == 0
    assert cli("train", *args, "--out", tmp_path / "b", "--max-steps", "3").code == 0
    refused = cli("train", "--out", tmp_path / "b", "--resume", "--max-steps", "6")
    one_line_error(refused, "cannot change max_steps", "--extend-to")
    assert cli("train", "--out", tmp_path / "b", "--resume", "--extend-to", "6", "--no-progress").code == 0

    def rows(run):
        data = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in data]

    assert rows(tmp_path / "a") == rows(tmp_path / "b")
    lrs = [r["lr"] for r in rows(tmp_path / "b") if r["kind"] == "train"]
    assert lrs[3:] == [3e-4] * 3 and lrs[0] == 3e-3 and lrs[2] > 3e-4  # tiny: lr 3e-3, min_lr 3e-4
    saved = json.loads((tmp_path / "b" / "run.json").read_text())["train"]
    assert (saved["max_steps"], saved["schedule_steps"]) == (6, 3)
    one_line_error(cli("train", "--out", tmp_path / "b", "--resume", "--extend-to", "5"), "not past")


def test_the_command_and_the_python_call_make_the_same_plan(cli, bytes_data, tiny_run, tmp_path, monkeypatch):
    """Every kind of input (preset, variant, config file, --set, the dedicated flags, resume and
    extension) arrives in `aogpt.train.plan` as a Python caller would pass it."""
    from aogpt.errors import AOGPTError
    from aogpt.train import RunPlan, plan

    made = []

    def stop(self):
        made.append(self)
        raise AOGPTError("stopped before training", "this is a test")

    monkeypatch.setattr(RunPlan, "run", stop)
    config = tmp_path / "c.toml"
    config.write_text("[model]\nn_layer = 3\n[train]\nwarmup_steps = 2\n")
    out = tmp_path / "r"
    flags = ("--max-steps", "7", "--max-minutes", "2.5", "--seed", "5", "--order", "mallows:0.5", "--batch-size", "4",
             "--grad-accum", "2", "--lr", "0.002", "--eval-interval", "3", "--ckpt-interval", "4", "--ema-decay", "0.9",
             "--keep-last", "1", "--block-size", "16", "--device", "cpu", "--dtype", "float32")
    one_line_error(cli("train", "--preset", "tiny", "--variant", "sigma", "--data", bytes_data, "--out", out,
                       "--config", config, "--set", "model.n_layer=4", "--set", "ema_warmup=false", *flags,
                       "--no-progress"), "stopped before training")
    python = plan(out, preset="tiny", variant="sigma", data=bytes_data, config=config,
                  overrides=["model.n_layer=4", "ema_warmup=false"], max_steps=7, max_minutes=2.5, seed=5,
                  order="mallows:0.5", batch_size=4, grad_accum=2, lr=0.002, eval_interval=3, ckpt_interval=4,
                  ema_decay=0.9, keep_last=1, block_size=16, device="cpu", dtype="float32", show_progress=False)
    assert made == [python]
    assert (python.model_cfg.n_layer, python.model_cfg.block_size, python.train_cfg.warmup_steps) == (4, 16, 2)
    assert (python.train_cfg.order, python.train_cfg.ema_warmup, python.train_cfg.max_minutes) == ("mallows:0.5",
                                                                                                   False, 2.5)
    one_line_error(cli("train", "--out", tiny_run, "--resume", "--extend-to", "9", "--keep-last", "3"),
                   "stopped before training")
    assert made[1] == plan(tiny_run, resume=True, extend_to=9, keep_last=3)
    assert made[1].resume_from is not None and made[1].train_cfg.max_steps == 9


def test_dry_run(cli):
    result = cli("train", "--preset", "gpt2-small", "--out", "unused", "--dry-run", "--json")
    assert result.code == 0, result.err
    plan = result.json
    assert plan["accumulation steps"] == 16 and plan["tokens per step"] == 524288
    assert plan["parameters"] == 170_605_952  # the released "124M" AO-GPT


def test_corrupted_checkpoint_is_refused_by_name_and_kept(cli, bytes_data, tmp_path):
    run = tmp_path / "run"
    assert cli("train", "--preset", "tiny", "--data", bytes_data, "--out", run, "--max-steps", "4",
               "--set", "train.ckpt_interval=2", "--no-progress").code == 0
    good, bad = list_checkpoints(run)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    one_line_error(cli("train", "--out", run, "--resume", "--extend-to", "8"), "model.safetensors", "corrupted")
    assert good.is_dir() and bad.is_dir()
    assert cli("train", "--out", run, "--resume-from", good, "--extend-to", "6", "--no-progress").code == 0
    (good.parent / "ckpt-0000006" / "trainer.pt").write_bytes(b"not a pickle")
    one_line_error(cli("train", "--out", run, "--resume", "--extend-to", "8"), "trainer.pt")


def test_nan_loss_exits_2_naming_the_step(cli, bytes_data, tmp_path, monkeypatch):
    import aogpt.train.step as step_mod

    real = step_mod.training_loss
    calls = {"n": 0}

    def poisoned(*a):
        calls["n"] += 1
        loss = real(*a)
        return loss * float("nan") if calls["n"] >= 3 else loss

    monkeypatch.setattr(step_mod, "training_loss", poisoned)  # where the optimizer step looks it up
    one_line_error(cli("train", "--preset", "tiny", "--data", bytes_data, "--out", tmp_path / "r", "--max-steps", "5",
                       "--no-progress"), "at step 3")
