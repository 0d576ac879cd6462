"""Every option of every command, found by walking the parser, gets random values (hypothesis), in
the company of up to two other options with random values:
numbers of every size and sign, NaN and infinities, words, the option's own choices. Whatever the
values, the command must succeed or print exactly one ``error:`` line with exit status 2: no
traceback, and no file that existed before is changed.

So that nothing runs for long, the work after the checks is replaced by a stand-in that stops the
command (`_Reached`): a command that gets there counts as a success. The checks themselves
(argument types, configs, files read, memory estimates against 4 GiB of stand-in memory) all run.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aogpt.checkpoint import list_checkpoints
from aogpt.cli import build_parser
from tests.cli.test_malformed import snapshot

# 3 examples per option (1 for a flag without a value) in the suite, the same ones every run;
# AOGPT_OPTION_EXAMPLES=50 draws that many fresh ones per option (a longer hunt for bugs)
EXAMPLES = int(os.environ.get("AOGPT_OPTION_EXAMPLES", 3))
DERANDOMIZE = "AOGPT_OPTION_EXAMPLES" not in os.environ
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "reference-checkpoints" / "ckpt_aogpt.pt"
HARNESS = Path(__file__).resolve().parents[1] / "fixtures" / "harness"

BASES = {  # an invocation that is valid on its own; the random options are added to it
    "prepare": ["prepare", "--corpus", "{corpus}", "--tokenizer", "bytes", "--out", "{t}/p", "--no-progress"],
    "train": ["train", "--preset", "tiny", "--data", "{data}", "--out", "{t}/r", "--no-progress"],
    "sample": ["sample", "--checkpoint", "{run}", "--no-progress"],
    "eval": ["eval", "--checkpoint", "{run}", "--data", "{data}"],
    "bench generate": ["bench", "generate", "--quick", "--out", "{t}/b", "--no-progress"],
    "bench density": ["bench", "density", "--quick", "--out", "{t}/b", "--no-progress"],
    "bench train": ["bench", "train", "--quick", "--out", "{t}/b", "--no-progress"],
    "bench attention": ["bench", "attention", "--quick", "--out", "{t}/b", "--no-progress"],
    "bench eval": ["bench", "eval", "--quick", "--out", "{t}/b", "--no-progress"],
    "bench prepare": ["bench", "prepare", "--quick", "--corpus", "{corpus}", "--out", "{t}/b", "--no-progress"],
    "bench speculative": ["bench", "speculative", "--checkpoint", "aogpt={run}", "--n", "8", "--batch", "1",
                          "--k", "2", "--out", "{t}/b", "--no-progress"],
    "bench adaptive": ["bench", "adaptive", "--quick", "--no-text", "--out", "{t}/b", "--work", "{t}/w",
                       "--no-progress"],
    "bench recipe": ["bench", "recipe", "--quick", "--data-root", "{t}/d", "--out", "{t}/b", "--no-progress"],
    "bench adapt": ["bench", "adapt", "--quick", "--data-root", "{t}/d", "--out", "{t}/b", "--no-progress"],
    "adapt": ["adapt", "--from", "{run}", "--out", "{t}/a"],
    "reproduce": ["reproduce", "--quick", "--out", "{t}/rep", "--no-progress"],
    "compare": ["compare", "{run}", "{run}", "--out", "{t}/cmp"],
    "harness": ["harness", "--checkpoint", "{run}", "--tasks", "aogpt_last_word", "--include-path", "{harness}"],
    "import": ["import", str(FIXTURE), "--out", "{t}/imported"],
    "export": ["export", "{run}", "--out", "{t}/x.pt"],
    "serve": ["serve", "--checkpoint", "{run}", "--port", "0"],
    "bench serve": ["bench", "serve", "--checkpoint", "{run}", "--quick", "--out", "{t}/b", "--no-progress"],
    "bench gpu": ["bench", "gpu", "--quick", "--out", "{t}/b", "--no-progress"],
    "bench gap-length": ["bench", "gap-length", "--checkpoint", "{run}", "--data", "{data}", "--quick",
                         "--out", "{t}/b", "--no-progress"],
    "bench gated": ["bench", "gated", "--quick", "--out", "{t}/b", "--no-progress"],
}


class _Reached(BaseException):
    """The command passed its checks and reached its work (not an error: a success)."""


def _stop(*args, **kwargs):
    raise _Reached


STAND_INS = [  # where each command's work begins, after every check
    "aogpt.train.planning.RunPlan.run",  # train
    "aogpt.generation.generate.for_inference",  # sample, eval --genppl-samples
    "aogpt.evaluation.evaluate.evaluate",  # eval
    "aogpt.evaluation.genppl.score_samples",
    "aogpt.data.prepared.write_splits",  # prepare, bench prepare
    "aogpt.bench.generation.generate.build_model",
    "aogpt.bench.generation.density.build_model",
    "aogpt.bench.training.eval.build_model",
    "aogpt.train.Trainer",  # bench train
    "aogpt.bench.training.prepare.synthetic_corpus",
    "aogpt.bench.generation.speculative.bench_speculative",
    "aogpt.bench.generation.adaptive.bench_adaptive",
    "aogpt.reproduce.pipeline.prepare_data",
    "aogpt.bench.training.recipe.sweep",
    "aogpt.bench.training.recipe.thread_speedup",
    "aogpt.bench.training.adapt.run",
    "aogpt.adaptation.read_source",  # adapt
    "aogpt.hf.harness.AOGPTLM",
    "aogpt.serve.engine.Engine",  # serve
    "aogpt.bench.serve.clients.bench_serve",
    "aogpt.bench.gpu.run.Run",  # bench gpu
    "aogpt.reproduce.compare.overlay",  # compare: its plot, once the runs are read and --out checked
    "aogpt.bench.generation.gap_length.bench_gap_length",
    "aogpt.bench.generation.gated.bench_gated",
]


def commands() -> dict[str, argparse.ArgumentParser]:
    """``{"train": parser, "bench generate": parser, ...}`` for every command, found in the parser."""
    found = {}

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs and path:
            found[" ".join(path)] = parser
        for action in subs:
            for name, sub in action.choices.items():
                walk(sub, [*path, name])

    walk(build_parser(), [])
    return found


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_every_command_has_a_base_and_every_number_declares_its_range():
    found = commands()
    assert set(found) == set(BASES)
    unchecked = [f"{name} {a.option_strings[0]}" for name, p in found.items() for a in options(p)
                 if a.type in (int, float) or getattr(a.type, "__name__", "") in ("int", "float")]
    assert unchecked == []  # use config_arg / int_arg / finite_float / positive_int (aogpt.cli.common)


NUMBERS = st.one_of(
    st.integers(min_value=-10**30, max_value=10**30).map(str),
    st.integers(min_value=-3, max_value=70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e309", "-0", "0.0", "1e-320", "0x10", "1_000", " 7 ", "", "1/2"]),
)
WORDS = st.text(alphabet="abcxyz019:=,._-[]MASK ", max_size=12).filter(lambda s: not s.startswith("-"))


def value_strategy(action: argparse.Action) -> st.SearchStrategy[list[str]]:
    """Argument strings for one option: nothing for a flag, a random value otherwise."""
    if action.nargs == 0:
        return st.just([])
    if action.choices:
        return st.one_of(st.sampled_from(list(action.choices)), WORDS).map(lambda v: [v])
    if getattr(action.type, "bounds", None) is not None:
        return NUMBERS.map(lambda v: [v])
    return st.one_of(WORDS, NUMBERS).map(lambda v: [v])


def argv_strategy(parser: argparse.ArgumentParser, first: argparse.Action) -> st.SearchStrategy[list[str]]:
    """Option `first` and up to two more of the command's options, each with a random value (as
    ``--flag=value``, so a value may start with a dash)."""
    others = [a for a in options(parser) if a is not first]

    @st.composite
    def build(draw) -> list[str]:
        chosen = [first, *draw(st.lists(st.sampled_from(others), max_size=2, unique_by=id))]
        argv: list[str] = []
        for action in chosen:
            flag = max(action.option_strings, key=len)
            argv += [flag] if action.nargs == 0 else [f"{flag}={v}" for v in draw(value_strategy(action))]
        return argv

    return build()


@pytest.mark.parametrize("command", sorted(BASES))
def test_random_values_for_every_option(command, cli, bytes_data, tiny_run, tmp_path, monkeypatch, make_corpus):
    for target in STAND_INS:
        monkeypatch.setattr(target, _stop)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemAvailable: {4 * 2**20} kB\n")
    monkeypatch.setattr("aogpt.memory.MEMINFO", meminfo)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)  # relative paths drawn at random land here
    corpus = make_corpus(tmp_path / "corpus", docs=3, words=80)
    # One parser for the test's hundred-odd calls, as one process builds one: building it takes most of a
    # refused call's time, and nothing in it depends on a call (no stateful actions, no defaults read from
    # the environment); each call still parses its own arguments into a fresh namespace.
    whole = build_parser()
    monkeypatch.setattr("aogpt.cli.build_parser", lambda: whole)
    parser = commands()[command]
    counter = iter(range(10**6))

    def check(extra: list[str]) -> None:
        fill = {"data": bytes_data, "run": tiny_run, "corpus": corpus, "t": tmp_path / f"new{next(counter)}",
                "harness": HARNESS}
        argv = [a.format(**fill) for a in BASES[command]] + extra
        before = snapshot(bytes_data, tiny_run, corpus)
        try:
            result = cli(*argv)
        except _Reached:
            return
        finally:
            assert snapshot(bytes_data, tiny_run, corpus) == before, argv
        lines = [line for line in result.err.splitlines() if line.strip()]
        assert "Traceback" not in result.err, (argv, result.err)
        if result.code == 0:
            return
        assert result.code == 2, (argv, result.err)
        errors = [line for line in lines if line.startswith("error:")]
        assert len(errors) == 1 and lines[-1] == errors[0], (argv, result.err)

    for action in options(parser):  # every option in turn, with random company
        examples = 1 if action.nargs == 0 else EXAMPLES
        settings(max_examples=examples, deadline=None, derandomize=DERANDOMIZE, database=None,
                 suppress_health_check=list(HealthCheck))(given(extra=argv_strategy(parser, action))(check))()
    assert list_checkpoints(tiny_run)  # the shared run is intact
