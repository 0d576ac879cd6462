"""`aogpt train` end to end and every bad input it must refuse with one line and exit 2."""

from __future__ import annotations

import json

import pytest

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
    assert result.out.startswith("training aogpt (2 layers, width 32, context 32) for 4 steps of 8 x 32 tokens")
    assert summary["bpb/l2r/ema"] > 0 and summary["planned_steps"] == 4 and summary["stopped_by"] == "max_steps"
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


def test_dry_run(cli):
    result = cli("train", "--preset", "gpt2-small", "--out", "unused", "--dry-run", "--json")
    assert result.code == 0, result.err
    plan = result.json
    assert plan["accumulation steps"] == 16 and plan["tokens per step"] == 524288
    assert plan["parameters"] == 170_605_952  # the released "124M" AO-GPT


@pytest.mark.parametrize("extra,fragments", [
    (("--preset", "huge"), ("unknown preset",)),
    (("--variant", "bert"), ("unknown variant",)),
    (("--order", "sideways"), ("unknown order spec",)),
    (("--variant", "gpt", "--order", "uniform"), ("left to right only",)),
    (("--set", "model.n_layers=3"), ("unknown key 'n_layers'",)),
    (("--set", "train.lr=fast"), ("lr must be float",)),
    (("--set", "nonsense"), ("KEY=VALUE",)),
])
def test_bad_flags(cli, bytes_data, tmp_path, extra, fragments):
    one_line_error(cli("train", "--data", bytes_data, "--out", tmp_path / "r", "--max-steps", "1", *extra),
                   *fragments)
    assert not list_checkpoints(tmp_path / "r") if (tmp_path / "r").exists() else True


def test_bad_config_file(cli, bytes_data, tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"train": {"max_step": 3}}')
    one_line_error(cli("train", "--data", bytes_data, "--out", tmp_path / "r", "--config", cfg), "unknown key")
    cfg.write_text('{"model": {"n_layer": "two"}}')
    one_line_error(cli("train", "--data", bytes_data, "--out", tmp_path / "r", "--config", cfg), "must be int")


def test_missing_and_mismatched_data(cli, bytes_data, tmp_path):
    one_line_error(cli("train", "--preset", "tiny", "--data", tmp_path / "nope", "--out", tmp_path / "r"))
    one_line_error(cli("train", "--preset", "tiny", "--out", tmp_path / "r"), "no training data")
    one_line_error(cli("train", "--preset", "tiny", "--data", bytes_data, "--out", tmp_path / "r",
                       "--set", "model.vocab_size=64"), "tokenizer")


def test_resume_with_data_of_another_tokenizer(cli, tiny_run, tmp_path, make_corpus):
    from aogpt.data import prepare

    other = tmp_path / "other"
    prepare(str(make_corpus(tmp_path / "c", docs=4)), "bpe:300", other, val_fraction=0.25, progress=False)
    one_line_error(cli("train", "--out", tiny_run, "--resume", "--data", other, "--extend-to", "8"), "tokenizer")


def test_block_size_beyond_the_models(cli, bytes_data, tiny_run, tmp_path):
    one_line_error(cli("train", "--preset", "tiny", "--data", bytes_data, "--out", tmp_path / "r",
                       "--init-from", tiny_run, "--block-size", "64"), "block size")
    one_line_error(cli("train", "--preset", "tiny", "--data", bytes_data, "--out", tmp_path / "r",
                       "--block-size", "100000"), "fewer than one block")


def test_unwritable_output(cli, bytes_data, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    one_line_error(cli("train", "--preset", "tiny", "--data", bytes_data, "--out", blocker / "run"), "cannot create")


def test_existing_run_is_not_overwritten(cli, bytes_data, tiny_run):
    before = [p.name for p in list_checkpoints(tiny_run)]
    one_line_error(cli("train", "--preset", "tiny", "--data", bytes_data, "--out", tiny_run), "--resume")
    assert [p.name for p in list_checkpoints(tiny_run)] == before


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


def test_changing_the_model_on_resume_is_refused(cli, tiny_run):
    one_line_error(cli("train", "--out", tiny_run, "--resume", "--set", "model.n_layer=3"), "cannot change the model")
    one_line_error(cli("train", "--out", tiny_run, "--resume", "--lr", "0.5"), "cannot change lr")


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
