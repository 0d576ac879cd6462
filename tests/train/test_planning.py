"""`aogpt.train.plan`: a run's configuration resolved in one pass, called as a Python user calls it.

The precedence of the sources (preset < config file < overrides < fields by name), what a resume and
--init-from may change, the vocabulary, every refusal, and the run directory's lock. `aogpt train`
hands its flags to the same function (tests/cli/test_train.py checks it makes the same plan); the
command line's one-line errors for the same mistakes are in tests/cli/test_malformed.py.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from aogpt.checkpoint import list_checkpoints
from aogpt.errors import AOGPTError
from aogpt.io import directory_lock
from aogpt.train import RunPlan, plan, run_lock


@pytest.fixture
def small_memory(tmp_path, monkeypatch):
    """The memory check sees 4 GiB available, on any machine."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {8 * 2**20} kB\nMemAvailable: {4 * 2**20} kB\n")
    monkeypatch.setattr("aogpt.memory.MEMINFO", meminfo)
    monkeypatch.delenv("AOGPT_SKIP_MEMORY_CHECK", raising=False)


def test_sources_in_precedence_preset_file_overrides_fields(tmp_path, bytes_data):
    out = tmp_path / "run"
    config = tmp_path / "c.toml"
    config.write_text('preset = "tiny"\n[model]\nn_layer = 3\n[train]\nlr = 0.01\neval_batches = 3\n')

    def asked(**kwargs):
        p = plan(out, data=bytes_data, dry_run=True, **kwargs)
        return p.preset, p.model_cfg.n_layer, p.train_cfg.lr, p.train_cfg.eval_batches

    assert asked() == ("cpu-small", 4, 2e-3, 8)  # the default preset
    assert asked(preset="tiny") == ("tiny", 2, 3e-3, 2)
    assert asked(config=config) == ("tiny", 3, 0.01, 3)  # the file's preset, then its fields
    assert asked(config=config, preset="cpu-small")[:2] == ("cpu-small", 3)  # a given preset beats the file's
    assert asked(config=config, overrides=["model.n_layer=5", "lr=0.02"]) == ("tiny", 5, 0.02, 3)
    assert asked(config=config, overrides=["n_layer=5", "lr=0.02"], n_layer=6, lr=0.03) == ("tiny", 6, 0.03, 3)
    assert asked(preset="tiny", lr=None) == ("tiny", 2, 3e-3, 2)  # None: not given, like a flag left out
    assert not out.exists()  # planning writes nothing


def test_variant_and_family_defaults(tmp_path, bytes_data):
    def made(**kwargs):
        return plan(tmp_path / "r", data=bytes_data, preset="tiny", dry_run=True, **kwargs)

    gpt = made(variant="gpt")
    assert (gpt.model_cfg.variant, gpt.model_cfg.norm, gpt.model_cfg.target, gpt.train_cfg.order) == \
        ("gpt", "layernorm", "none", "l2r")  # the family's architecture beats the preset's
    assert made().model_cfg.variant == "aogpt" and made().train_cfg.order == "mixture"
    assert made(variant="sigma", order="uniform").train_cfg.order == "uniform"
    config = tmp_path / "v.json"
    config.write_text(json.dumps({"variant": "sigma"}))
    assert made(config=config).model_cfg.variant == "sigma"
    assert made(config=config, overrides=["model.variant=gpt"]).model_cfg.variant == "gpt"
    assert made(config=config, overrides=["model.variant=gpt"], variant="aogpt").model_cfg.variant == "aogpt"


def test_fields_without_a_flag_reach_the_configs_by_every_route(tmp_path, bytes_data):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"model": {"target_dim": 24}, "train": {"ema_warmup": False}}))
    p = plan(tmp_path / "r", data=bytes_data, preset="tiny", config=config, overrides=["train.beta2=0.9"],
             pos_init="sinusoidal", l2r_first_steps=3, dry_run=True)
    assert (p.model_cfg.target_dim, p.train_cfg.ema_warmup, p.train_cfg.beta2) == (24, False, 0.9)
    assert (p.model_cfg.pos_init, p.train_cfg.l2r_first_steps) == ("sinusoidal", 3)


def test_the_vocabulary_is_sized_from_the_data(tmp_path, bytes_data):
    assert plan(tmp_path / "r", data=bytes_data, preset="tiny", dry_run=True).model_cfg.vocab_size == 320
    assert plan(tmp_path / "r", data=bytes_data, preset="tiny", vocab_size=512, dry_run=True).model_cfg.vocab_size \
        == 512
    dry = plan(tmp_path / "r", preset="gpt2-small", vocab_size=50257, dry_run=True)  # no data: as asked
    assert dry.model_cfg.vocab_size == 50257
    with pytest.raises(AOGPTError, match="tokenizer bytes .257 tokens. but the model's vocabulary holds 64"):
        plan(tmp_path / "r", data=bytes_data, preset="tiny", vocab_size=64)


def test_a_real_plan_is_frozen_and_knows_its_run(tmp_path, bytes_data):
    p = plan(tmp_path / "r", data=str(bytes_data), preset="tiny", max_steps=3, show_progress=False)
    assert isinstance(p, RunPlan) and not p.dry_run and p.resume_from is None and p.info.world_size == 1
    assert p.data_dir == Path(bytes_data).resolve() and p.tokenizer.spec == "bytes"
    assert p.run_meta == {"tokenizer": "bytes", "data": str(Path(bytes_data).resolve()), "preset": "tiny"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.out = tmp_path / "elsewhere"
    assert p == plan(tmp_path / "r", data=bytes_data, preset="tiny", max_steps=3, show_progress=False)


def test_a_dry_run_needs_no_data_and_never_runs(tmp_path):
    p = plan(tmp_path / "r", preset="gpt2-small", dry_run=True)
    assert p.dry_run and p.data is None and p.model_cfg.vocab_size == 50304
    with pytest.raises(AOGPTError, match="dry-run plan"):
        p.run()
    assert not (tmp_path / "r").exists()


def test_a_plan_from_python_trains_like_the_command(cli, tmp_path, bytes_data):
    """The same inputs through Python and through `aogpt train` give the same run, record for record."""
    summary = plan(tmp_path / "py", data=bytes_data, preset="tiny", max_steps=2, show_progress=False).run()
    assert summary["step"] == 2 and summary["stopped_by"] == "max_steps"
    assert cli("train", "--out", tmp_path / "cli", "--data", bytes_data, "--preset", "tiny", "--max-steps", "2",
               "--no-progress").code == 0

    def records(run):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "mfu")} for r in rows]

    assert records(tmp_path / "py") == records(tmp_path / "cli")
    run_json = [json.loads((tmp_path / run / "run.json").read_text()) for run in ("py", "cli")]
    assert run_json[0] == run_json[1]
    assert not (tmp_path / "py" / ".aogpt.lock").exists()  # run() took the lock and gave it back


def test_run_takes_the_lock_a_second_writer_holds(tmp_path, bytes_data):
    out = tmp_path / "r"
    p = plan(out, data=bytes_data, preset="tiny", max_steps=1, show_progress=False)
    with directory_lock(out, "aogpt train", inside=True):
        with pytest.raises(AOGPTError, match="is in use by process"):
            p.run()
    assert not list_checkpoints(out)


def test_run_lock_refuses_an_unwritable_directory_and_removes_one_it_made(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(AOGPTError, match="cannot create directory"):
        with run_lock(blocker / "run"):
            pass
    with pytest.raises(AOGPTError, match="refused"):
        with run_lock(tmp_path / "new"):
            raise AOGPTError("refused")
    assert not (tmp_path / "new").exists()  # made here, still empty: removed again


# ------------------------------------------------------------------------------------- refusals
CONFIG_FILES = {"unknown-key.json": '{"train": {"max_step": 3}}', "wrong-type.json": '{"model": {"n_layer": "two"}}',
                "preset-number.json": '{"preset": 3}', "list.json": "[1, 2]"}

NEW_RUN_REFUSALS = [
    ({"preset": "huge"}, "unknown preset 'huge'"),
    ({"variant": "bert"}, "unknown variant"),
    ({"order": "sideways"}, "unknown order spec 'sideways'"),
    ({"variant": "gpt", "order": "uniform"}, "variant gpt reads left to right only"),
    ({"overrides": ["model.n_layers=3"]}, "unknown key 'n_layers' in model config"),
    ({"overrides": ["train.lr=fast"]}, "train config: lr must be float, got 'fast'"),
    ({"overrides": ["nonsense"]}, "--set 'nonsense' is not KEY=VALUE"),
    ({"overrides": ["optim.lr=1"]}, "unknown section 'optim'"),
    ({"overrides": ["model.dropout=1.5"]}, "model config: dropout must be in [0, 1), got 1.5"),
    ({"lrr": 0.1}, "unknown key 'lrr' in train config"),
    ({"lr": float("nan")}, "train config: lr must be a finite number"),
    ({"min_lr": 0.5}, "min_lr 0.5 is above lr"),
    ({"config": "unknown-key.json"}, "unknown key 'max_step'"),
    ({"config": "wrong-type.json"}, "model config: n_layer must be int, got 'two'"),
    ({"config": "preset-number.json"}, "preset must be a string"),
    ({"config": "list.json"}, "must hold a table/object"),
    ({"config": "nope.json"}, "not found"),
    ({"data": "nothing-here"}, "does not exist"),
    ({"data": None}, "no training data given"),
    ({"block_size": 100000}, "fewer than one block of 100000"),
    ({"extend_to": 9}, "--extend-to continues a run"),
    ({"fsdp": True}, "--fsdp shards the model over several processes"),
    ({"batch_size": 1000000}, "training needs about"),
    ({"init_from": "nothing-here"}, "does not exist"),
    ({"init_from": "{run}", "block_size": 64}, "does not fit variant aogpt with block size 64"),
    ({"init_from": "{run}", "variant": "gpt"}, "does not fit variant gpt"),
    ({"out": "{run}"}, "already holds checkpoints"),
]

RESUME_REFUSALS = [
    ({"preset": "gpt2-small"}, "cannot change the preset when resuming (the run used tiny, not gpt2-small)"),
    ({"max_steps": 100}, "cannot change max_steps when resuming"),
    ({"extend_to": 2}, "--extend-to 2 is not past the checkpoint's step 6"),
    ({}, "is the end of its run (step 6 of 6)"),
    ({"lr": 0.5}, "cannot change lr when resuming"),
    ({"overrides": ["model.n_layer=3"]}, "cannot change the model when resuming (n_layer)"),
    ({"variant": "gpt"}, "cannot change the model when resuming (variant)"),
    ({"order": "l2r"}, "cannot change order when resuming"),
    ({"out": "empty", "resume_from": None}, "no checkpoint found"),
    ({"resume_from": "imported"}, "holds no training state"),
    ({"data": "other-tokenizer", "extend_to": 8}, "tokenizer"),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory, tiny_run):
    """Files the refusals point to: config files, an imported checkpoint, data of another tokenizer."""
    import aogpt
    from aogpt.data import prepare
    from tests.conftest import make_corpus

    root = tmp_path_factory.mktemp("places")
    for name, text in CONFIG_FILES.items():
        (root / name).write_text(text)
    (root / "empty").mkdir()
    loaded = aogpt.load(tiny_run)
    aogpt.save(loaded.model, root / "imported", tokenizer=loaded.tokenizer, step=6)
    prepare(str(make_corpus(root / "corpus", docs=4)), "bpe:300", root / "other-tokenizer", val_fraction=0.25,
            progress=False)
    return root


def _inputs(case: dict, places: Path, tiny_run: Path) -> dict:
    def place(value):
        if value == "{run}":
            return tiny_run
        return places / value if isinstance(value, str) and (places / value).exists() else value

    return {k: place(v) for k, v in case.items()}


@pytest.mark.parametrize("case, message", NEW_RUN_REFUSALS, ids=[m[:40] for _, m in NEW_RUN_REFUSALS])
def test_a_new_run_is_refused(case, message, tmp_path, bytes_data, tiny_run, places, small_memory):
    inputs = {"out": tmp_path / "r", "data": bytes_data, "preset": "tiny", **_inputs(case, places, tiny_run)}
    before = sorted(p.name for p in list_checkpoints(tiny_run))
    with pytest.raises(AOGPTError) as refused:
        plan(**inputs)
    assert message in str(refused.value)
    assert not (tmp_path / "r").exists() and sorted(p.name for p in list_checkpoints(tiny_run)) == before


@pytest.mark.parametrize("case, message", RESUME_REFUSALS, ids=[m[:40] for _, m in RESUME_REFUSALS])
def test_a_resume_is_refused(case, message, tiny_run, places):
    inputs = {"out": tiny_run, "resume": True, **_inputs(case, places, tiny_run)}
    with pytest.raises(AOGPTError) as refused:
        plan(**inputs)
    assert message in str(refused.value)


def test_a_resume_keeps_the_recipe_and_takes_only_logistics(tiny_run, bytes_data):
    saved = json.loads((list_checkpoints(tiny_run)[-1] / "config.json").read_text())
    p = plan(tiny_run, resume=True, extend_to=8, eval_interval=2, keep_last=3, lr=saved["train"]["lr"])
    assert p.resume_from == list_checkpoints(tiny_run)[-1] and p.preset == "tiny"
    assert p.data_dir == Path(bytes_data).resolve()  # the run's own data
    assert (p.train_cfg.max_steps, p.train_cfg.schedule_steps) == (8, 6)  # the original horizon kept
    assert (p.train_cfg.eval_interval, p.train_cfg.keep_last) == (2, 3)
    assert dataclasses.asdict(p.model_cfg) == saved["model"]
    unchanged = {k: v for k, v in saved["train"].items() if k not in ("max_steps", "schedule_steps", "eval_interval",
                                                                       "keep_last")}
    assert {k: getattr(p.train_cfg, k) for k in unchanged} == unchanged
    assert plan(tiny_run, resume_from=list_checkpoints(tiny_run)[0], extend_to=8).resume_from == \
        list_checkpoints(tiny_run)[0]


def test_init_from_starts_from_the_checkpoints_model(tmp_path, tiny_run, bytes_data):
    p = plan(tmp_path / "r", data=bytes_data, preset="tiny", init_from=str(tiny_run), dry_run=True)
    saved = json.loads((list_checkpoints(tiny_run)[-1] / "config.json").read_text())["model"]
    assert dataclasses.asdict(p.model_cfg) == saved and p.train_cfg.init_from == str(tiny_run)
    copy = tmp_path / "copy"
    shutil.copytree(list_checkpoints(tiny_run)[-1], copy)
    assert plan(tmp_path / "r", data=bytes_data, preset="tiny", init_from=copy, dry_run=True).model_cfg == p.model_cfg


def test_freezing_the_backbone_needs_a_target_pathway(tmp_path, bytes_data):
    assert plan(tmp_path / "a", data=bytes_data, preset="tiny", variant="aogpt", freeze_backbone_steps=3,
                dry_run=True).train_cfg.freeze_backbone_steps == 3
    with pytest.raises(AOGPTError, match="no target pathway to train while the backbone is frozen"):
        plan(tmp_path / "g", data=bytes_data, preset="tiny", variant="gpt", freeze_backbone_steps=3, dry_run=True)
