"""Zero-shot suites: detokenizers on hand-written examples, packing rules on synthetic data, local
loaders on small hand-made files, the hub path's offline error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from aogpt.data import zeroshot
from aogpt.data.tokenizer import ByteTokenizer
from aogpt.data.zeroshot import detok_lambada, detok_lm1b, detok_ptb, detok_wikitext, load_blocks, load_examples, pack
from aogpt.errors import AOGPTError

FIX = Path(__file__).parents[1] / "fixtures" / "zeroshot"


@pytest.mark.parametrize("raw, want", [
    (" = Robert Boulter = \n", " = Robert Boulter =\n"),
    (" = = Career = = \n", " == Career ==\n"),
    (" = = = Later work = = = \n", " === Later work ===\n"),
    ("a guest @-@ starring role", "a guest-starring role"),
    ("sold 1 @,@ 000 copies , about 3 @.@ 5 % .", "sold 1,000 copies, about 3.5 % ."),
    ("Boulter 's role : a test ; really ! why ? yes . No", "Boulter's role: a test; really! why? yes. No"),
    ("the players ' union", "the players' union"),
    ('the play " Citizenship " ( born 1984 ) [ 1 ] { x }', 'the play "Citizenship" (born 1984) [1] {x}'),
    ("he said ' great ' then", "he said 'great' then"),
    ("at 20 \u00b0 C", "at 20\u00b0C"),
    ("line one \n second", "line one\nsecond"),
    ("about N people", "about 1 people"),
])
def test_wikitext_detokenizer(raw: str, want: str) -> None:
    assert detok_wikitext(raw) == want


@pytest.mark.parametrize("raw, want", [
    ("the company 's shares were n't traded N N N days", "the company's shares weren't traded 1 1 1 days"),
    ("he paid $ N for the <unk> \\/ item", "he paid $1 for the ? / item"),
    ("the investors ' money", "the investors' money"),
    ("rank # N of N N N N N N N N N N N end", "rank #1 of 1 1 1 1 1 1 1 1 1 1 1 end"),
    ("a \n b", "a\nb"),
])
def test_ptb_detokenizer(raw: str, want: str) -> None:
    assert detok_ptb(raw) == want


@pytest.mark.parametrize("raw, want", [
    ("Visit http : / / example.com for more .", "Visit http://example.com for more."),
    ("see https : / / a.org now", "see https://a.org now"),
    ("It 's the end , he said ; really ?", "It's the end, he said; really?"),
    ('She said " hello there " ( twice ) for $ 5 .', 'She said "hello there" (twice) for $5.'),
    ("Stop ! Now , go : it is 1 / 2 of [ the ] cost in \u00a3 5", "Stop! Now, go: it is 1/2 of [the] cost in \u00a35"),
    ("a ' quoted bit ' here . And more", "a 'quoted bit' here. And more"),
    ("Really ? Yes !", "Really? Yes!"),
])
def test_lm1b_detokenizer(raw: str, want: str) -> None:
    assert detok_lm1b(raw) == want


def test_lambada_detokenizer() -> None:
    assert detok_lambada("\u201cCome here,\u201d she said.  ") == '\n"Come here," she said.'
    assert detok_lambada("  plain text\n") == "\nplain text"


def test_pack_concatenates_with_eos_and_drops_the_remainder() -> None:
    examples = [[1, 2, 3], [4], [5, 6]]  # stream: 1 2 3 E 4 E 5 6 E   (E = 0)
    assert pack(examples, 3, eos=0).tolist() == [[1, 2, 3], [0, 4, 0], [5, 6, 0]]
    assert pack(examples, 4, eos=0).tolist() == [[1, 2, 3, 0], [4, 0, 5, 6]]
    assert pack(examples, 10, eos=0).shape == (0, 10)
    assert pack([[]], 1, eos=9).tolist() == [[9]]  # an empty example still contributes its EOS


def test_pack_wrapped_variant() -> None:
    examples = [[1, 2, 3], [4], [5, 6]]  # bodies of 2: [1 2] [3 E] [4 E] [5 6], remainder [E] dropped
    want = [[0, 1, 2, 0], [0, 3, 0, 0], [0, 4, 0, 0], [0, 5, 6, 0]]
    assert pack(examples, 4, eos=0, wrap=True).tolist() == want
    with pytest.raises(AOGPTError, match="too short to wrap"):
        pack(examples, 2, eos=0, wrap=True)


def test_local_suites_are_read_and_detokenized() -> None:
    lam, info = load_examples("lambada", FIX)
    assert lam == ['\n"Come here," she said. He went', "\nthe end of the story"] and info["split"] == "test"
    wt2, info = load_examples("wikitext2", FIX)
    assert info["split"] == "validation"
    assert wt2 == [
        "",
        " = Robert Boulter =\n",
        "",
        " Robert Boulter is an English film, television and theatre actor. He had a guest-starring role in 2000.\n",
        ' In 2006, he starred alongside Whishaw in the play "Citizenship" written by Mark Ravenhill.\n',
    ]
    ptb, _ = load_examples("ptb", FIX)
    assert ptb == ["the company's shares weren't traded 1 1 1 days", "he paid $1 for the ? / item",
                   "the investors' money"]
    lm1b, info = load_examples("lm1b", FIX)
    assert info["split"] == "test"
    assert lm1b == ["Visit http://example.com for more.", "It's the end, he said; really?",
                    'She said "hello there" (twice) for $5.']
    wt103, _ = load_examples("wikitext103", FIX)  # the generic NAME.jsonl fallback
    assert wt103 == [" == Career ==\n", " It sold 1,000 copies at 20\u00b0C.\n"]


def test_blocks_use_the_models_tokenizer_and_eos() -> None:
    tok = ByteTokenizer()
    blocks, info = load_blocks("ptb", tok, 16, data_dir=FIX)
    texts = ["the company's shares weren't traded 1 1 1 days", "he paid $1 for the ? / item", "the investors' money"]
    stream = [b for t in texts for b in (*t.encode("utf-8"), 256)]
    want = torch.tensor(stream[: len(stream) // 16 * 16]).view(-1, 16)
    assert torch.equal(blocks, want)
    assert info["examples"] == 3 and info["blocks"] == want.shape[0] and info["tokenizer"] == "bytes"
    wrapped, _ = load_blocks("ptb", tok, 16, data_dir=FIX, wrap=True)
    assert torch.equal(wrapped[:, 1:-1].flatten(), torch.tensor(stream[: wrapped.shape[0] * 14]))
    assert (wrapped[:, 0] == 256).all() and (wrapped[:, -1] == 256).all()
    with pytest.raises(AOGPTError, match="less than one block"):
        load_blocks("lambada", tok, 4096, data_dir=FIX)


def test_missing_and_unknown_sets_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(AOGPTError, match=r"no lm1b file .*news.en.heldout-00000-of-00050"):
        load_examples("lm1b", tmp_path)
    with pytest.raises(AOGPTError, match="unknown evaluation set"):
        load_examples("imdb", tmp_path)
    (tmp_path / "ptb.jsonl").write_text('{"text": 3}\n')
    with pytest.raises(AOGPTError, match="holds no text"):
        load_examples("ptb", tmp_path)


def test_hub_without_datasets_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails even where it is installed
    with pytest.raises(AOGPTError, match="needs the package datasets"):
        load_examples("wikitext2")


def test_hub_failures_are_reported_per_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    class Offline:
        @staticmethod
        def load_dataset(path, config, split):
            raise ConnectionError(f"cannot reach {path}\nlong traceback text")

    monkeypatch.setitem(sys.modules, "datasets", Offline)
    with pytest.raises(AOGPTError) as err:
        load_examples("wikitext103")
    assert "Salesforce/wikitext: cannot reach Salesforce/wikitext" in str(err.value)
    assert "long traceback" not in str(err.value) and "--data-dir" in str(err.value)

    class Hub:
        @staticmethod
        def load_dataset(path, config, split):
            assert (path, config, split) == ("ptb-text-only/ptb_text_only", None, "validation")
            return [{"sentence": "it 's N"}]

    monkeypatch.setitem(sys.modules, "datasets", Hub)
    assert load_examples("ptb")[0] == ["it's N"]  # a trailing N has no space after it: kept


def test_suite_names() -> None:
    assert zeroshot.names("paper") == ["lambada", "wikitext2", "ptb", "wikitext103", "lm1b"]
    assert zeroshot.names("offline,ptb, ptb") == ["shakespeare", "wiki-excerpt", "ptb"]
    with pytest.raises(AOGPTError):
        zeroshot.names(" , ")
    with pytest.raises(AOGPTError, match="unknown evaluation set 'imdb'"):
        zeroshot.names("ptb,imdb")
    assert all(zeroshot.SUITES[s].split != "train" for s in zeroshot.SUITES)


def test_offline_stand_ins() -> None:
    plays, info = load_examples("shakespeare")
    assert len(plays) == 3 and info["split"] == "val" and info["detokenizer"] is None
    assert any("HAMLET" in p for p in plays) and any("PROSPERO" in p for p in plays)
