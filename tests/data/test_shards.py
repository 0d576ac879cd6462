"""Data at scale: shards equal the unsharded stream, workers change nothing, interrupted runs resume to
identical files, batches over shards (exact windows, chi-square frequencies), bad input."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from scipy import stats

from aogpt.data import PreparedData, partial_dir, prepare
from aogpt.data import shards as shards_mod
from aogpt.data.tokenizer import ByteTokenizer, load_tokenizer
from aogpt.errors import AOGPTError
from tests.data.test_corpora import fake_datasets

WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()
SHARD = 7919  # tokens per shard in most tests: a prime, so boundaries fall anywhere
VAL_DOCS = 40


def rows(n: int = 2000, seed: int = 0) -> list[dict]:
    """Small documents of varied length, some blank, one long one (spanning shards, cut into pieces)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 97 == 13:
            out.append({"text": " \n" if i % 2 else ""})
        elif i == 700:
            out.append({"text": "".join(f"{' '.join(rng.choices(WORDS, k=12))}.\n" for _ in range(1500))})
        else:
            words = " ".join(rng.choices(WORDS, k=rng.randint(3, 40)))
            out.append({"text": f"Doc {i}: {words} café ✓.\n"})
    return out


def expected_bytes(texts: list[str]) -> np.ndarray:
    """The bytes tokenizer's stream, computed by hand: UTF-8 bytes then EOT (256) per non-blank text."""
    ids: list[int] = []
    for t in texts:
        if t.strip():
            ids += list(t.encode()) + [256]
    return np.array(ids, dtype=np.uint16)


def files(d) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def stream(d: PreparedData, split: str) -> np.ndarray:
    return np.concatenate([np.asarray(m) for m in d.shards(split)])


@pytest.fixture
def owt(monkeypatch: pytest.MonkeyPatch) -> dict:
    """A fake streamed dataset `hf:fake/owt` (train split only); returns its log."""
    log = fake_datasets(monkeypatch, {"train": rows()})
    log["rows"] = [r["text"] for r in rows()]
    return log


def run(out, spec: str = "bytes", **kw):
    kw = {"val_docs": VAL_DOCS, "shard_tokens": SHARD, "progress": False, "workers": 1, **kw}
    return prepare("hf:fake/owt", spec, out, **kw)


def test_shards_concatenate_to_the_unsharded_stream(tmp_path, owt) -> None:
    whole = run(tmp_path / "whole", shard_tokens=10**9)
    assert whole["format_version"] == 1 and whole["splits"]["train"]["file"] == "train.bin"
    meta = run(tmp_path / "sharded")
    assert meta["format_version"] == 2 and meta["shard_tokens"] == SHARD
    texts = owt["rows"]
    want = {"train": expected_bytes(texts[:-VAL_DOCS]), "val": expected_bytes(texts[-VAL_DOCS:])}
    one, many = PreparedData(tmp_path / "whole"), PreparedData(tmp_path / "sharded")
    for split in ("train", "val"):
        assert np.array_equal(one.split(split), want[split])
        assert np.array_equal(stream(many, split), want[split])
        assert many.num_tokens(split) == len(want[split])
        assert many.meta["splits"][split]["documents"] == one.meta["splits"][split]["documents"]
        texts_of_split = texts[:-VAL_DOCS] if split == "train" else texts[-VAL_DOCS:]
        utf8 = sum(len(t.encode()) for t in texts_of_split if t.strip())  # blank documents write nothing
        assert many.meta["splits"][split]["bytes"] == one.meta["splits"][split]["bytes"] == utf8
    infos = many.shard_info("train")
    assert len(infos) == -(-len(want["train"]) // SHARD) > 20
    assert [s["file"] for s in infos[:2]] == ["train-00000.bin", "train-00001.bin"]
    assert all(s["tokens"] == SHARD for s in infos[:-1]) and 0 < infos[-1]["tokens"] <= SHARD
    for info, m in zip(infos, many.shards("train"), strict=True):  # a shard counts the EOTs it holds
        assert info["documents"] == int((np.asarray(m) == 256).sum())
    assert many.meta["splits"]["val"]["file"] == "val.bin"  # the small split stays one file
    assert many.meta["splits"]["val"]["documents"] == VAL_DOCS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sharded", "whole"]  # no partial directory left
    with pytest.raises(ValueError, match="shards"):
        many.split("train")


@pytest.mark.parametrize("spec", ["gpt2", "bpe:300"])
def test_two_workers_write_the_same_files_as_one(tmp_path, owt, monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    monkeypatch.setattr(shards_mod, "CHUNK_CHARS", 5000)  # many chunks in flight
    run(tmp_path / "one", spec, workers=1, shard_tokens=3001)
    meta = run(tmp_path / "two", spec, workers=2, shard_tokens=3001)
    assert files(tmp_path / "one") == files(tmp_path / "two")
    d = PreparedData(tmp_path / "two")
    assert len(d.shard_info("train")) > 3
    tok = load_tokenizer(spec, tmp_path / "two")  # by hand: every non-blank document, encoded whole, + EOT
    texts = [t for t in owt["rows"] if t.strip()]
    want = [i for t in texts[:-VAL_DOCS] for i in [*tok.encode(t), tok.eot_id]]
    assert stream(d, "train").tolist() == want
    assert meta["splits"]["val"]["documents"] == VAL_DOCS


class Interrupt(BaseException):
    """Stands in for a crash or Ctrl-C (a BaseException, like KeyboardInterrupt)."""


def commits_of_a_full_run(out, monkeypatch: pytest.MonkeyPatch, **kw) -> list[dict]:
    seen: list[dict] = []
    real = shards_mod.write_json

    def record(path, obj):
        seen.append(json.loads(json.dumps(obj)))
        real(path, obj)

    monkeypatch.setattr(shards_mod, "write_json", record)
    run(out, **kw)
    monkeypatch.setattr(shards_mod, "write_json", real)
    return seen


def exact_shard_tokens() -> int:
    """A shard size whose first boundary falls exactly after a document's EOT."""
    texts = [r["text"] for r in rows()]
    return int(np.flatnonzero(expected_bytes(texts[:-VAL_DOCS]) == 256)[49]) + 1


@pytest.mark.parametrize("exact", [False, True])
def test_interrupted_runs_resume_to_identical_files(tmp_path, owt, monkeypatch: pytest.MonkeyPatch, exact) -> None:
    size = exact_shard_tokens() if exact else SHARD
    commits = commits_of_a_full_run(tmp_path / "reference", monkeypatch, shard_tokens=size)
    reference = files(tmp_path / "reference")
    in_long = [k for k in range(1, len(commits)) if sum(commits[k - 1]["done"].values()) == 700]
    if exact:
        assert commits[0]["partial"] is None and commits[1]["partial"] is not None
        ks = [1, 2]  # resume right after a whole document, and from inside one
    else:
        texts = [r["text"] for r in rows()]
        start = len(expected_bytes(texts[:700]))  # where the long document begins in the stream
        first_cut = {"split": "train", "tokens": (start // SHARD + 1) * SHARD - start}
        assert len(in_long) > 3 and commits[in_long[0] - 1]["partial"] == first_cut
        ks = [2, in_long[0], in_long[-1], len(commits) - 1]  # before, inside and after the long document
    real = shards_mod.write_json
    for k in ks:  # crash instead of writing commit k
        out = tmp_path / f"out{k}"
        calls = []

        def crash(path, obj, calls=calls, k=k):
            if len(calls) == k:
                raise Interrupt
            calls.append(1)
            real(path, obj)

        monkeypatch.setattr(shards_mod, "write_json", crash)
        with pytest.raises(Interrupt):
            run(out, shard_tokens=size)
        monkeypatch.setattr(shards_mod, "write_json", real)
        assert not out.exists() and (partial_dir(out) / "progress.json").is_file()  # never a half-done out
        owt["skips"].clear()
        meta = run(out, shard_tokens=size, workers=2 if k == ks[1] and not exact else 1)  # any worker count
        done = sum(commits[k - 1]["done"].values())
        assert meta["resumed_documents"] == done and owt["skips"] == [done]
        assert files(out) == reference, k
        assert not partial_dir(out).exists()


def test_a_crash_mid_shard_resumes(tmp_path, owt, monkeypatch: pytest.MonkeyPatch) -> None:
    run(tmp_path / "reference")
    calls = []
    real = ByteTokenizer.encode_batch

    def fail_late(self, texts):
        calls.append(1)
        if len(calls) == 3:
            raise Interrupt
        return real(self, texts)

    monkeypatch.setattr(shards_mod, "CHUNK_CHARS", 20_000)
    monkeypatch.setattr(ByteTokenizer, "encode_batch", fail_late)
    with pytest.raises(Interrupt):
        run(tmp_path / "out")
    partial = partial_dir(tmp_path / "out")
    progress = json.loads((partial / "progress.json").read_text())
    opened = progress["splits"]["train"]["open"]
    assert (partial / opened["file"]).stat().st_size > 2 * opened["tokens"]  # written after the last commit
    monkeypatch.setattr(ByteTokenizer, "encode_batch", real)
    run(tmp_path / "out")
    assert files(tmp_path / "out") == files(tmp_path / "reference")


def test_resume_refuses_other_settings_and_checks_shards(tmp_path, owt, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    with pytest.raises(AOGPTError, match="nothing to resume"):
        run(out, resume="require")

    def crash_at_third_commit(path, obj, calls=[]):  # noqa: B006 (a counter)
        calls.append(1)
        if len(calls) == 3:
            raise Interrupt
        real(path, obj)

    real = shards_mod.write_json
    monkeypatch.setattr(shards_mod, "write_json", crash_at_third_commit)
    with pytest.raises(Interrupt):
        run(out)
    monkeypatch.setattr(shards_mod, "write_json", real)
    with pytest.raises(AOGPTError, match=r"other settings \(differs in: shard_tokens\).*--restart"):
        run(out, shard_tokens=SHARD + 1, resume="require")
    with pytest.raises(AOGPTError, match=r"differs in: tokenizer, val_docs"):
        run(out, "gpt2", val_docs=VAL_DOCS + 1)
    first = partial_dir(out) / "train-00000.bin"
    data = bytearray(first.read_bytes())
    data[5] ^= 1
    first.write_bytes(bytes(data))
    with pytest.raises(AOGPTError, match="train-00000.bin is missing or changed"):
        run(out)
    assert partial_dir(out).is_dir()  # refused, not discarded
    run(out, resume="restart")
    run(tmp_path / "reference")
    assert files(out) == files(tmp_path / "reference")


def test_failure_before_any_shard_leaves_nothing(tmp_path, owt, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self, texts):
        raise RuntimeError("boom")

    monkeypatch.setattr(ByteTokenizer, "encode_batch", broken)
    with pytest.raises(RuntimeError, match="boom"):
        run(tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_bad_settings(tmp_path, owt) -> None:
    with pytest.raises(AOGPTError, match="--shard-tokens must be at least 1"):
        run(tmp_path / "o", shard_tokens=0)
    with pytest.raises(AOGPTError, match="--workers must be at least 1"):
        run(tmp_path / "o", workers=0)
    with pytest.raises(AOGPTError, match="leaves no training documents|empty train split"):
        run(tmp_path / "o", val_docs=5000)
    assert list(tmp_path.iterdir()) == []


# --- batches over shards ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> PreparedData:
    """train: shards of 800 tokens and a shorter last one (bytes of a local text corpus)."""
    root = tmp_path_factory.mktemp("sharded")
    rng = random.Random(1)
    for i in range(12):
        (root / f"{i:02d}.txt").write_text(" ".join(rng.choices(WORDS, k=80)) + "\n")
    prepare(str(root), "bytes", root / "out", val_docs=2, shard_tokens=800, progress=False)
    d = PreparedData(root / "out")
    sizes = [s["tokens"] for s in d.shard_info("train")]
    assert len(sizes) > 3 and sizes[:-1] == [800] * (len(sizes) - 1) and 400 < sizes[-1] < 700, sizes
    return d


def brute_force_windows(d: PreparedData, split: str, block: int, starts: list[int]) -> list[list[int]]:
    """Global start g -> the g-th valid window, counting shard by shard (windows inside one shard)."""
    out = []
    for g in starts:
        for m in d.shards(split):
            valid = max(0, len(m) - block + 1)
            if g < valid:
                assert g + block <= len(m)
                out.append(np.asarray(m[g : g + block]).tolist())
                break
            g -= valid
        else:
            raise AssertionError("start beyond the valid windows")
    return out


def test_get_batch_draws_exact_windows_over_shards(sharded: PreparedData) -> None:
    block = 300
    valid = [max(0, s["tokens"] - block + 1) for s in sharded.shard_info("train")]
    x = sharded.get_batch("train", 64, block, torch.Generator().manual_seed(5))
    starts = torch.randint(sum(valid), (64,), generator=torch.Generator().manual_seed(5)).tolist()
    assert x.tolist() == brute_force_windows(sharded, "train", block, starts)
    assert torch.equal(x, sharded.get_batch("train", 64, block, 5))
    a, b = (sharded.get_batch("train", 8, block, np.random.default_rng(3)) for _ in range(2))
    assert torch.equal(a, b)


def test_get_batch_shard_frequencies_chi_square(sharded: PreparedData) -> None:
    block = 300
    maps = [np.asarray(m) for m in sharded.shards("train")]
    valid = np.array([len(m) - block + 1 for m in maps])
    x = sharded.get_batch("train", 20_000, block, torch.Generator().manual_seed(0)).numpy()
    # find each window's shard by content (independent of the sampler's arithmetic); windows are unique here
    index = {}
    for k, m in enumerate(maps):
        for s in range(len(m) - block + 1):
            index.setdefault(m[s : s + 16].tobytes(), set()).add((k, s))
    counts = np.zeros(len(maps))
    for row in x:
        near = index[row[:16].astype(maps[0].dtype).tobytes()]
        hits = [(k, s) for k, s in near if np.array_equal(maps[k][s : s + block], row)]
        assert len(hits) >= 1  # the window lies inside one shard
        counts[hits[0][0]] += 1
    assert (counts > 0).all()
    p = stats.chisquare(counts, valid / valid.sum() * counts.sum()).pvalue
    assert p > 1e-3, (counts, valid)


def test_eval_batches_walk_shards_in_order(sharded: PreparedData) -> None:
    block, batch = 128, 5
    maps = sharded.shards("train")
    want = [np.asarray(m[w * block : (w + 1) * block]).tolist() for m in maps for w in range(len(m) // block)]
    got = [row for b in sharded.iter_eval_batches("train", batch, block) for row in b.tolist()]
    assert got == want
    n = sharded.num_eval_batches("train", batch, block)
    assert n == -(-len(want) // batch) and len(list(sharded.iter_eval_batches("train", batch, block))) == n
    assert [b.shape[0] for b in sharded.iter_eval_batches("train", batch, block, max_batches=3)] == [5, 5, 5]


def test_blocks_larger_than_any_shard(sharded: PreparedData) -> None:
    assert sharded.num_tokens("train") > 2000
    with pytest.raises(AOGPTError, match=r"every shard of the train split .* fewer than 801 tokens.*--shard-tokens"):
        sharded.get_batch("train", 1, 801, 0)
    with pytest.raises(AOGPTError, match="every shard"):
        next(sharded.iter_eval_batches("train", 1, 801))
    assert sharded.get_batch("train", 3, 800, 0).shape == (3, 800)  # the full shards still serve


def test_a_truncated_shard_is_reported(sharded: PreparedData, tmp_path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(sharded.directory, copy)
    with open(copy / "train-00001.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(AOGPTError, match="train-00001.bin has 10 bytes, but meta.json promises 800 uint16"):
        PreparedData(copy).get_batch("train", 1, 8, 0)


def test_a_worker_that_cannot_load_the_tokenizer_fails_cleanly(tmp_path) -> None:
    from aogpt.data.tokenizer import train_bpe

    tok = train_bpe(["a small text to train on\n"] * 20, 300)  # its tokenizer.json is not in tmp_path
    source = iter([[("train", "hello")], [("train", "world")]])
    with pytest.raises(AOGPTError, match="needs its trained tokenizer.json"):
        list(shards_mod.encoded(source, tok, tmp_path, np.dtype(np.uint16), 2))


def test_interleaved_splits_shard_and_resume(tmp_path, owt, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hash split: validation documents arrive between training ones, so both splits' open shards are
    committed mid-stream and truncated on resume."""
    kw = {"val_docs": None, "val_fraction": 0.3, "shard_tokens": 3001}
    run(tmp_path / "whole", **{**kw, "shard_tokens": 10**9})
    whole = PreparedData(tmp_path / "whole")
    commits = commits_of_a_full_run(tmp_path / "reference", monkeypatch, **kw)
    reference = PreparedData(tmp_path / "reference")
    for split in ("train", "val"):
        assert len(reference.shard_info(split)) > 5
        assert np.array_equal(stream(reference, split), whole.split(split))

    def resumed_with_open(split: str) -> list[int]:  # commits k whose predecessor left `split` mid-shard
        return [k for k in range(1, len(commits)) if commits[k - 1]["splits"][split]["open"]["tokens"]]

    real = shards_mod.write_json
    for k in (resumed_with_open("val")[3], resumed_with_open("train")[-3]):
        calls = []

        def crash(path, obj, calls=calls, k=k):
            if len(calls) == k:
                raise Interrupt
            calls.append(1)
            real(path, obj)

        monkeypatch.setattr(shards_mod, "write_json", crash)
        with pytest.raises(Interrupt):
            run(tmp_path / f"out{k}", **kw)
        monkeypatch.setattr(shards_mod, "write_json", real)
        partial = partial_dir(tmp_path / f"out{k}")
        for split, state in json.loads((partial / "progress.json").read_text())["splits"].items():
            grown = (partial / state["open"]["file"]).stat().st_size - 2 * state["open"]["tokens"]
            assert grown > 0 or split == "train", (split, k)  # validation ids written after the commit
        run(tmp_path / f"out{k}", **kw)
        assert files(tmp_path / f"out{k}") == files(tmp_path / "reference"), k
