"""Training corpora: the running Python's standard library source, or the user's own text.

A :class:`Corpus` is an ordered tuple of documents, each assigned to ``train``, ``validation`` or
``probe`` by a hash of its relative path (so adding a file never moves another file between
splits). The default corpus is the standard library of the running Python (``*.py`` under
``sysconfig.get_paths()["stdlib"]``, without ``site-packages``, test folders and the generated
codec tables in ``encodings/``): about 12 MB of real text that every Python installation carries.
Its :attr:`Corpus.content_hash` changes with the Python version, which is why trained models are
cached by it.

Token streams put the tokenizer's EOS between documents and are cut into fixed-length training
sequences by :func:`chunk_tokens`. :func:`probe_snippets` / :meth:`Corpus.probe_tokens` give
deterministic held-out prompts (used by head-stability studies).
"""

from __future__ import annotations

import hashlib
import io
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from circuitstat.core.errors import InputError

__all__ = [
    "Document",
    "Corpus",
    "CorpusError",
    "SPLITS",
    "split_of",
    "stdlib_corpus",
    "text_corpus",
    "parquet_corpus",
    "load_corpus",
    "chunk_tokens",
    "probe_snippets",
]

SPLITS = ("train", "validation", "probe")
DEFAULT_FRACTIONS = (0.90, 0.05, 0.05)
STDLIB_EXCLUDE_DIRS = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test", "encodings"}
)


class CorpusError(InputError):
    """A corpus could not be built (no files, missing column, unreadable file)."""


@dataclass(frozen=True)
class Document:
    path: str  # relative path (or "file.parquet#row") — the key the split is computed from
    text: str
    split: str


def split_of(key: str, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> str:
    """Deterministic split of a document key: sha256(key) mapped to [0, 1) against ``fractions``."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise CorpusError(f"split fractions must be 3 non-negative numbers summing to 1, got {fractions}")
    u = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0**64
    acc = 0.0
    for name, f in zip(SPLITS, fractions):
        acc += f
        if u < acc:
            return name
    return SPLITS[-1]


class Corpus:
    """An ordered collection of documents with a train/validation/probe split and a content hash."""

    def __init__(self, documents: Iterable[Document], name: str = "corpus",
                 fractions: Sequence[float] = DEFAULT_FRACTIONS):
        self.documents: tuple[Document, ...] = tuple(documents)
        self.name = name
        self.fractions = tuple(float(f) for f in fractions)
        if not self.documents:
            raise CorpusError(f"corpus {name!r} has no documents")
        self._hash: str | None = None

    @classmethod
    def from_texts(cls, items: Iterable[tuple[str, str]], name: str = "corpus",
                   fractions: Sequence[float] = DEFAULT_FRACTIONS) -> "Corpus":
        """Build from ``(key, text)`` pairs; the split comes from the key."""
        docs = [Document(k, t, split_of(k, fractions)) for k, t in items if t]
        return cls(docs, name=name, fractions=fractions)

    def __len__(self) -> int:
        return len(self.documents)

    def __repr__(self) -> str:
        counts = {s: sum(d.split == s for d in self.documents) for s in SPLITS}
        return f"Corpus({self.name!r}, {len(self)} documents {counts}, {self.n_chars:,} chars)"

    @property
    def n_chars(self) -> int:
        return sum(len(d.text) for d in self.documents)

    def split(self, name: str) -> list[Document]:
        if name not in SPLITS:
            raise CorpusError(f"unknown split {name!r}; choose one of {SPLITS}")
        return [d for d in self.documents if d.split == name]

    def texts(self, split: str | None = None) -> list[str]:
        docs = self.documents if split is None else self.split(split)
        return [d.text for d in docs]

    @property
    def content_hash(self) -> str:
        """sha256 over every document's key, split and text (in order)."""
        if self._hash is None:
            h = hashlib.sha256(b"circuitstat-corpus-v1")
            for d in self.documents:
                for part in (d.path, d.split, d.text):
                    b = part.encode("utf-8", "surrogatepass")
                    h.update(len(b).to_bytes(8, "little"))
                    h.update(b)
            self._hash = h.hexdigest()
        return self._hash

    # -- tokens ------------------------------------------------------------------------------
    def tokens(self, tokenizer, split: str = "train", cache_dir: str | os.PathLike | None = None) -> np.ndarray:
        """The split as one int32 token stream, EOS between documents.

        With ``cache_dir`` and a tokenizer that has a ``content_hash``, the stream is cached as
        ``.npy`` keyed by (corpus hash, tokenizer hash, split).
        """
        docs = self.split(split)
        if not docs:
            raise CorpusError(f"corpus {self.name!r} has no {split!r} documents; use more files or other fractions")
        path = None
        thash = getattr(tokenizer, "content_hash", None)
        if cache_dir is not None and thash:
            key = hashlib.sha256(f"{self.content_hash}|{thash}|{split}".encode()).hexdigest()[:24]
            path = Path(cache_dir) / f"tokens-{key}.npy"
            if path.exists():
                return np.load(path, mmap_mode="r")
        eos = tokenizer.eos_id
        encode_batch = getattr(tokenizer, "encode_batch", None)
        texts = [d.text for d in docs]
        encoded = encode_batch(texts) if encode_batch else [tokenizer.encode(t) for t in texts]
        parts = []
        for ids in encoded:
            parts.append(np.asarray(ids, dtype=np.int32))
            if eos is not None:
                parts.append(np.asarray([eos], dtype=np.int32))
        arr = np.concatenate(parts)
        if path is not None:
            from circuitstat.core.atomic import atomic_write

            buf = io.BytesIO()
            np.save(buf, arr)
            with atomic_write(path) as f:
                f.write(buf.getvalue())
        return arr

    def sequences(self, tokenizer, seq_len: int, split: str = "train",
                  cache_dir: str | os.PathLike | None = None) -> np.ndarray:
        """``[n, seq_len]`` int32 training sequences cut from the split's token stream."""
        return chunk_tokens(self.tokens(tokenizer, split, cache_dir=cache_dir), seq_len)

    # -- probes ------------------------------------------------------------------------------
    def probe_snippets(self, n: int = 100, n_chars: int = 400, seed: int = 0, split: str = "probe") -> list[str]:
        """``n`` deterministic held-out snippets of about ``n_chars`` characters from the probe split.

        Each starts at a line start of a probe document and ends at a line end; lines that are
        only whitespace at the start are skipped. Same corpus and arguments -> same snippets.
        """
        docs = [d for d in self.split(split) if len(d.text.strip()) >= 16]
        if not docs:
            raise CorpusError(f"corpus {self.name!r} has no usable {split!r} documents for probe snippets")
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0x9B0BE]))
        weights = np.array([len(d.text) for d in docs], dtype=np.float64)
        weights /= weights.sum()
        out: list[str] = []
        seen: set[str] = set()
        tries = 0
        while len(out) < n:
            tries += 1
            if tries > 50 * n + 1000:
                raise CorpusError(f"could not draw {n} distinct probe snippets from corpus {self.name!r}")
            d = docs[rng.choice(len(docs), p=weights)]
            text = d.text
            start = int(rng.integers(0, max(1, len(text) - n_chars // 2)))
            start = text.rfind("\n", 0, start) + 1  # line start
            while start < len(text) and text[start] in "\n\r":
                start += 1
            end = text.find("\n", start + n_chars)
            end = len(text) if end < 0 else end
            snippet = text[start:end]
            if len(snippet) > 2 * n_chars:  # one very long line: cut it
                snippet = snippet[:n_chars]
            if len(snippet.strip()) < 16 or snippet in seen:
                continue
            seen.add(snippet)
            out.append(snippet)
        return out

    def probe_tokens(self, tokenizer, n: int = 100, n_tokens: int = 64, seed: int = 0,
                     split: str = "probe", prepend_bos: bool = True) -> np.ndarray:
        """``[n, n_tokens]`` int64 held-out prompts of exactly ``n_tokens`` tokens (BOS first if
        the tokenizer has one and ``prepend_bos``), windows drawn deterministically from the
        probe split's token stream without overlap."""
        stream = self.tokens(tokenizer, split)
        bos = tokenizer.bos_id if prepend_bos else None
        body = n_tokens - (1 if bos is not None else 0)
        if body < 1:
            raise CorpusError("n_tokens must leave room for at least one token after BOS")
        windows = len(stream) // body
        if windows < n:
            raise CorpusError(
                f"the {split!r} split has {len(stream)} tokens: too few for {n} probes of {n_tokens} "
                "tokens; lower n or n_tokens"
            )
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0x9B0BE, 1]))
        picks = np.sort(rng.choice(windows, size=n, replace=False))
        rows = np.stack([np.asarray(stream[i * body:(i + 1) * body]) for i in picks]).astype(np.int64)
        if bos is not None:
            rows = np.concatenate([np.full((n, 1), bos, dtype=np.int64), rows], axis=1)
        return rows


def chunk_tokens(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """Cut a 1-D token stream into ``[n, seq_len]`` (the remainder is dropped; a view, no copy)."""
    tokens = np.asarray(tokens)
    if seq_len < 2:
        raise CorpusError(f"seq_len must be at least 2, got {seq_len}")
    n = len(tokens) // seq_len
    if n == 0:
        raise CorpusError(f"a stream of {len(tokens)} tokens is shorter than one sequence of {seq_len}")
    return tokens[: n * seq_len].reshape(n, seq_len)


def _read_text(p: Path) -> str:
    return p.read_text(encoding="utf-8", errors="replace")


def stdlib_corpus(root: str | os.PathLike | None = None,
                  exclude_dirs: Iterable[str] = STDLIB_EXCLUDE_DIRS,
                  fractions: Sequence[float] = DEFAULT_FRACTIONS) -> Corpus:
    """The running Python's standard library ``*.py`` files in sorted relative-path order."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise CorpusError(f"standard library folder {root} does not exist; pass text files instead")
    exclude = set(exclude_dirs)
    items = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in exclude]  # prune (site-packages can be huge)
        for fn in filenames:
            if fn.endswith(".py"):
                p = Path(dirpath) / fn
                items.append((p.relative_to(root).as_posix(), p))
    items.sort(key=lambda kv: kv[0])
    import platform

    name = f"stdlib-py{platform.python_version()}"
    return Corpus.from_texts(((k, _read_text(p)) for k, p in items), name=name, fractions=fractions)


def text_corpus(paths: str | os.PathLike | Sequence[str | os.PathLike],
                suffixes: Sequence[str] = (".txt", ".md", ".py", ".rst", ".text"),
                fractions: Sequence[float] = DEFAULT_FRACTIONS, name: str | None = None) -> Corpus:
    """User text files: files are taken as given; folders are searched recursively for ``suffixes``.
    Keys are paths relative to the given folder (file name for single files)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    items: list[tuple[str, str]] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.is_file() and q.suffix in suffixes)
            items += [(q.relative_to(p).as_posix(), _read_text(q)) for q in found]
        elif p.is_file():
            items.append((p.name, _read_text(p)))
        else:
            raise CorpusError(f"{p}: no such file or folder")
    if not any(t for _, t in items):
        raise CorpusError(f"no non-empty text files (suffixes {list(suffixes)}) under {[str(x) for x in paths]}")
    return Corpus.from_texts(items, name=name or "text", fractions=fractions)


def parquet_corpus(path: str | os.PathLike, column: str = "text",
                   fractions: Sequence[float] = DEFAULT_FRACTIONS) -> Corpus:
    """A Parquet file (or folder of them) with one document per row in column ``column``."""
    import pyarrow.parquet as pq

    p = Path(path).expanduser()
    files = sorted(p.rglob("*.parquet")) if p.is_dir() else [p]
    if not files or not files[0].exists():
        raise CorpusError(f"{p}: no Parquet file found")
    items = []
    for f in files:
        schema = pq.read_schema(f)
        if column not in schema.names:
            raise CorpusError(f"{f}: no column {column!r} (columns: {schema.names}); pass column=...")
        col = pq.read_table(f, columns=[column]).column(column).to_pylist()
        key = f.relative_to(p).as_posix() if p.is_dir() else f.name
        items += [(f"{key}#{i}", t) for i, t in enumerate(col) if isinstance(t, str) and t]
    if not items:
        raise CorpusError(f"{p}: column {column!r} has no non-empty strings")
    return Corpus.from_texts(items, name=p.stem, fractions=fractions)


def load_corpus(spec: str | os.PathLike | Corpus | None = "stdlib", **kw) -> Corpus:
    """``"stdlib"`` (default), a Parquet file/folder (``*.parquet``), or text files/folders."""
    if isinstance(spec, Corpus):
        return spec
    if spec is None or str(spec) == "stdlib":
        return stdlib_corpus(**kw)
    p = Path(spec).expanduser()
    if p.suffix == ".parquet" or (p.is_dir() and any(p.rglob("*.parquet"))):
        return parquet_corpus(p, **kw)
    return text_corpus(p, **kw)


_STDLIB: Corpus | None = None


def probe_snippets(n: int = 100, n_chars: int = 400, seed: int = 0, corpus: Corpus | None = None) -> list[str]:
    """``n`` deterministic held-out snippets (default: the standard-library corpus's probe split)."""
    global _STDLIB
    if corpus is None:
        if _STDLIB is None:
            _STDLIB = stdlib_corpus()
        corpus = _STDLIB
    return corpus.probe_snippets(n=n, n_chars=n_chars, seed=seed)
