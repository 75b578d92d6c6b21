import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from circuitstat.circuits.corpus import (
    SPLITS,
    Corpus,
    CorpusError,
    chunk_tokens,
    load_corpus,
    parquet_corpus,
    probe_snippets,
    split_of,
    stdlib_corpus,
    text_corpus,
)
from circuitstat.circuits.tokenizers import train_bpe


@pytest.fixture(scope="module")
def stdlib():
    return stdlib_corpus()


@pytest.fixture(scope="module")
def small():
    items = [(f"mod{i:03d}.py", f"def f{i}(x):\n    return x + {i}\n" * (1 + i % 5)) for i in range(200)]
    return Corpus.from_texts(items, name="small")


@pytest.fixture(scope="module")
def tok(small):
    return train_bpe(small.texts("train"), vocab_size=300)


def test_stdlib_corpus_is_deterministic_and_split(stdlib):
    again = stdlib_corpus()
    assert stdlib.content_hash == again.content_hash
    paths = [d.path for d in stdlib.documents]
    assert paths == sorted(paths)
    assert not any(p.startswith(("site-packages/", "test/", "encodings/")) or "/tests/" in p for p in paths)
    assert any(p == "os.py" for p in paths)
    counts = {s: len(stdlib.split(s)) for s in SPLITS}
    assert all(counts[s] > 5 for s in SPLITS), counts
    assert counts["train"] > 10 * counts["validation"]
    assert stdlib.n_chars > 2_000_000
    for d in stdlib.documents[:50]:
        assert d.split == split_of(d.path)


def test_split_of_is_stable_and_validated():
    assert split_of("os.py") == split_of("os.py")
    keys = [f"f{i}.py" for i in range(2000)]
    share = np.mean([split_of(k) == "train" for k in keys])
    assert 0.85 < share < 0.95
    assert all(split_of(k, (0, 0, 1)) == "probe" for k in keys[:20])
    with pytest.raises(CorpusError, match="fractions"):
        split_of("x", (0.5, 0.5, 0.5))


def test_tokens_and_chunks(small, tok, tmp_path):
    stream = small.tokens(tok, "train")
    assert stream.dtype == np.int32
    assert (stream == tok.eos_id).sum() == len(small.split("train"))  # EOS after each document
    cached = small.tokens(tok, "train", cache_dir=tmp_path)
    again = small.tokens(tok, "train", cache_dir=tmp_path)  # read from the cache
    assert list(tmp_path.glob("tokens-*.npy"))
    np.testing.assert_array_equal(stream, cached)
    np.testing.assert_array_equal(stream, again)
    seqs = small.sequences(tok, 16)
    assert seqs.shape == (len(stream) // 16, 16)
    np.testing.assert_array_equal(seqs.reshape(-1), stream[: seqs.size])
    with pytest.raises(CorpusError, match="shorter"):
        chunk_tokens(np.arange(5), 16)


def test_probe_snippets_deterministic(stdlib):
    a = probe_snippets(20, corpus=stdlib)
    b = stdlib.probe_snippets(20)
    assert a == b and len(set(a)) == 20
    assert a != stdlib.probe_snippets(20, seed=1)
    assert stdlib.probe_snippets(30)[:20] == a  # prefix-stable: more snippets extend the list
    probe_text = "\n".join(stdlib.texts("probe"))
    assert all(s in probe_text for s in a)
    train_text = set(stdlib.texts("train"))
    assert not any(s in t for s in a[:3] for t in list(train_text)[:50])


def test_probe_tokens(small, tok):
    p = small.probe_tokens(tok, n=5, n_tokens=8)
    assert p.shape == (5, 8) and p.dtype == np.int64
    assert (p[:, 0] == tok.bos_id).all()
    np.testing.assert_array_equal(p, small.probe_tokens(tok, n=5, n_tokens=8))
    with pytest.raises(CorpusError, match="too few"):
        small.probe_tokens(tok, n=10_000, n_tokens=64)


def test_text_and_parquet_corpora(tmp_path):
    (tmp_path / "docs").mkdir()
    for i in range(30):
        (tmp_path / "docs" / f"{i}.txt").write_text(f"document number {i}\n")
    (tmp_path / "docs" / "skip.bin").write_bytes(b"\x00")
    c = text_corpus(tmp_path / "docs")
    assert len(c) == 30 and c.documents[0].path == "0.txt"
    assert load_corpus(tmp_path / "docs").content_hash == c.content_hash

    pq.write_table(pa.table({"text": [f"row {i}" for i in range(40)], "id": list(range(40))}), tmp_path / "d.parquet")
    p = parquet_corpus(tmp_path / "d.parquet")
    assert len(p) == 40 and p.documents[3].path == "d.parquet#3"
    assert load_corpus(tmp_path / "d.parquet").content_hash == p.content_hash
    with pytest.raises(CorpusError, match="no column 'body'"):
        parquet_corpus(tmp_path / "d.parquet", column="body")


def test_corpus_errors(tmp_path):
    with pytest.raises(CorpusError, match="no such file"):
        text_corpus(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="no non-empty"):
        text_corpus(tmp_path / "empty")
    with pytest.raises(CorpusError, match="no documents"):
        Corpus([])
