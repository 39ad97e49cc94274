"""The shipped offline corpus and tokenizer: real text, a real BPE, reproducible builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen3_trn.data import embedded
from tools import build_assets as ba

SENTENCE = "Return a new list containing all items from the iterable in ascending order."


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("json", data_files=str(embedded.corpus_path()), split="train")
    return list(ds["text"])


@pytest.fixture(scope="module")
def tokenizer():
    mod = pytest.importorskip("torchtitan.components.tokenizer")
    return mod.HuggingFaceTokenizer(tokenizer_path=str(embedded.tokenizer_dir()))


def test_packaged_assets_present() -> None:
    assert embedded.missing_assets(embedded.PACKAGED_ASSETS_DIR) == []
    assert embedded.ensure_assets() == embedded.PACKAGED_ASSETS_DIR
    assert embedded.corpus_path().name.endswith(".jsonl.gz")
    assert embedded.corpus_path().stat().st_size <= 1_600_000


def test_corpus_is_real_distinct_text(corpus: list[str]) -> None:
    assert len(corpus) >= 500
    assert len(set(corpus)) == len(corpus)
    assert all(ba.MIN_DOC_CHARS <= len(doc) <= ba.MAX_DOC_CHARS for doc in corpus)
    words = [w.strip(".,;:!?()[]{}\"'`*") for doc in corpus for w in doc.split()]
    assert sum(w.isalpha() for w in words) / len(words) > 0.6
    common = {"the", "and", "is", "of", "to", "a", "returns", "return"}
    assert sum(w.lower() in common for w in words) / len(words) > 0.05


def test_validation_split_is_disjoint(corpus: list[str]) -> None:
    datasets = pytest.importorskip("datasets")
    val = datasets.load_dataset("json", data_files=str(embedded.validation_corpus_path()), split="train")["text"]
    assert 0.005 * len(corpus) <= len(val) <= 0.05 * len(corpus)
    assert not set(val) & set(corpus)
    assert all(ba.is_validation(doc) for doc in val)


def test_torchtitan_tokenizer(tokenizer) -> None:
    assert tokenizer.get_vocab_size() == ba.VOCAB_SIZE == 2048
    assert tokenizer.bos_id is not None and tokenizer.eos_id is not None
    assert tokenizer.bos_id != tokenizer.eos_id
    assert max(tokenizer.bos_id, tokenizer.eos_id) < 2048
    plain = tokenizer.encode(SENTENCE)
    assert tokenizer.bos_id not in plain and tokenizer.eos_id not in plain
    assert tokenizer.decode(plain) == SENTENCE
    ids = tokenizer.encode(SENTENCE, add_bos=True, add_eos=True)
    assert ids[0] == tokenizer.bos_id and ids[-1] == tokenizer.eos_id
    assert ids[1:-1] == plain
    assert len(plain) < len(SENTENCE) / 2.5
    assert all(0 <= i < 2048 for i in ids)


def test_transformers_tokenizer_matches() -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(embedded.tokenizer_dir()))
    assert len(hf) == 2048
    assert hf.bos_token == ba.BOS_TOKEN and hf.eos_token == ba.EOS_TOKEN
    ids = hf(SENTENCE)["input_ids"]
    assert hf.decode(ids) == SENTENCE
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(embedded.tokenizer_dir() / "tokenizer.json"))
    assert ids == raw.encode(SENTENCE).ids


def test_chars_per_token(corpus: list[str]) -> None:
    assert ba.chars_per_token(embedded.tokenizer_dir(), corpus) > 2.5


def _small_build(out: Path) -> None:
    ba.build_assets(out, modules=("json", "textwrap", "shlex"), include_c_modules=False, include_topics=False)


def test_build_is_deterministic(tmp_path: Path) -> None:
    _small_build(tmp_path / "a")
    _small_build(tmp_path / "b")
    files = (ba.CORPUS_FILE, ba.VAL_CORPUS_FILE, "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json")
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    docs = ba.read_jsonl_gz(tmp_path / "a" / ba.CORPUS_FILE)
    assert docs and any("JSON" in d for d in docs)


def test_missing_assets_are_a_clear_error(tmp_path: Path) -> None:
    _small_build(tmp_path)
    assert embedded.ensure_assets(tmp_path) == tmp_path
    (tmp_path / "tokenizer" / "tokenizer.json").unlink()
    with pytest.raises(embedded.MissingAssetsError, match="tokenizer/tokenizer.json.*tools/build_assets.py"):
        embedded.ensure_assets(tmp_path)
