"""Training data: the cached tokenizer and token streams of a corpus, and the deterministic batches
(the order of training sequences is a pure function of (seed, step))."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import numpy as np

from circuitstat.circuits.cache import cache_dir
from circuitstat.core.errors import InputError

from .recipe import DataSpec, TrainRecipe

__all__ = ["prepare_data"]


def save_npy_atomic(path: Path, arr: np.ndarray) -> None:
    """Write ``arr`` to ``path`` as .npy atomically (temporary file, then rename); returns None."""
    from circuitstat.core.atomic import atomic_write

    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr))
    with atomic_write(path) as f:
        f.write(buf.getvalue())


TOKENIZER_SEAL = "SEAL.json"


def _cached(path: Path, root: Path, binding: dict, directory: bool = False) -> bool:
    """True when the cache entry ``path`` (a file, or a directory of files) below ``root`` exists and matches
    its seal; a linked, unsealed, foreign or changed entry is removed (False: the caller rebuilds it)."""
    from circuitstat.core.integrity import IntegrityError, check_entry, check_sealed_file, remove_entry, seal_path

    if not (path.exists() or path.is_symlink()):
        return False
    try:
        if directory:
            names = [p.name for p in path.iterdir() if p.name != TOKENIZER_SEAL] if path.is_dir() else []
            check_entry(path, names, binding, root=root, seal_name=TOKENIZER_SEAL)
        else:
            check_sealed_file(path, binding, root=root)
        return True
    except (IntegrityError, OSError):
        remove_entry(path, root=root)
        remove_entry(seal_path(path), root=root)
        return False


def _seal(path: Path, root: Path, binding: dict, directory: bool = False) -> None:
    """Seal a cache entry just written (circuitstat.core.integrity); a cache that cannot be written is not sealed,
    so it is rebuilt next time."""
    from circuitstat.core.integrity import IntegrityError, seal_entry, seal_file

    try:
        if directory:
            seal_entry(path, sorted(p.name for p in path.iterdir() if p.name != TOKENIZER_SEAL), binding,
                       seal_name=TOKENIZER_SEAL, root=root)
        else:
            seal_file(path, binding, root=root)
    except (OSError, IntegrityError):
        pass


def _tokenizer(recipe: TrainRecipe, corpus, cache: Path):
    """(the recipe's tokenizer, its cache directory): a BPE trained on the corpus' train split once, or the
    named tokenizer; either cached sealed under ``cache/tokenizers`` and rebuilt when its seal fails."""
    from circuitstat.circuits.tokenizers import load_tokenizer, train_bpe

    if recipe.tokenizer == "bpe":
        key = hashlib.sha256(f"bpe|{recipe.vocab_size}|{corpus.content_hash}".encode()).hexdigest()[:20]
        tdir = cache / "tokenizers" / f"bpe{recipe.vocab_size}-{key}"
        binding = {"kind": "tokenizer", "key": tdir.name}
        if _cached(tdir, cache, binding, directory=True):
            return load_tokenizer(tdir), tdir
        tok = train_bpe(corpus.texts("train"), vocab_size=recipe.vocab_size,
                        name=f"bpe{recipe.vocab_size}-{corpus.name}")
    else:
        tok = load_tokenizer(recipe.tokenizer)
        if tok is None:
            raise InputError(f"no tokenizer found at {recipe.tokenizer!r}")
        key = hashlib.sha256(tok.content_hash.encode()).hexdigest()[:20]
        tdir = cache / "tokenizers" / f"tok-{key}"
        binding = {"kind": "tokenizer", "key": tdir.name}
        if _cached(tdir, cache, binding, directory=True):
            return tok, tdir
    tok.save(tdir)
    _seal(tdir, cache, binding, directory=True)
    return tok, tdir


def prepare_data(recipe: TrainRecipe, corpus=None, cache: str | os.PathLike | None = None) -> DataSpec:
    """Build (or reuse from the cache) the tokenizer and the train/validation token streams.

    Every cached file is sealed when written and checked when reused (circuitstat.core.integrity): a linked,
    edited, truncated or foreign entry is removed and built again, never used.
    """
    from circuitstat.circuits.corpus import load_corpus

    cache = Path(cache) if cache is not None else cache_dir()
    corpus = load_corpus(corpus if corpus is not None else recipe.corpus)
    chash = corpus.content_hash
    tok, tdir = _tokenizer(recipe, corpus, cache)
    tok_cache = cache / "tokens"
    paths = {}
    n_train = 0
    for split in ("train", "validation"):
        key = hashlib.sha256(f"{chash}|{tok.content_hash}|{split}".encode()).hexdigest()[:24]
        p = tok_cache / f"{split}-{key}.npy"
        if not _cached(p, cache, {"kind": "tokens", "key": p.name}):
            arr = corpus.tokens(tok, split)
            if tok.vocab_size > np.iinfo(np.int32).max:  # pragma: no cover
                raise InputError("vocabulary too large")
            save_npy_atomic(p, arr.astype(np.int32))
            _seal(p, cache, {"kind": "tokens", "key": p.name})
        if split == "train":
            arr = np.load(p, mmap_mode="r", allow_pickle=False)
            n_train = int(arr.shape[0])
            cp = p.with_name(p.stem + "-counts.npy")
            if not _cached(cp, cache, {"kind": "token-counts", "key": cp.name}):
                save_npy_atomic(cp, np.bincount(np.asarray(arr), minlength=tok.vocab_size).astype(np.int64))
                _seal(cp, cache, {"kind": "token-counts", "key": cp.name})
            paths["counts"] = str(cp)
        paths[split] = str(p)
    return DataSpec(
        tokenizer_dir=str(tdir), train_tokens=paths["train"], val_tokens=paths["validation"],
        corpus_name=corpus.name, corpus_hash=chash, tokenizer_hash=tok.content_hash,
        vocab_size=int(tok.vocab_size), n_train_tokens=n_train, token_counts=paths["counts"],
    )


class Batches:
    """Deterministic batches: the order of training sequences is a pure function of (seed, step)."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int):
        self.seqs = chunk_tokens(tokens, seq_len)
        self.n = self.seqs.shape[0]
        if self.n < batch_size:
            raise InputError(
                f"the training split has {self.n} sequences of {seq_len} tokens, fewer than one batch of "
                f"{batch_size}; use a larger corpus or a smaller n_ctx/batch size"
            )
        self.batch_size = batch_size
        self.seed = int(seed)
        self._perm_epoch = -1
        self._perm: np.ndarray | None = None

    def _perm_for(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, 0xDA7A, epoch]))
            self._perm = rng.permutation(self.n)
            self._perm_epoch = epoch
        return self._perm

    def indices(self, step: int) -> np.ndarray:
        start = step * self.batch_size
        out = np.empty(self.batch_size, dtype=np.int64)
        for j in range(self.batch_size):
            i = start + j
            out[j] = self._perm_for(i // self.n)[i % self.n]
        return out

    def batch(self, step: int, repeat_fraction: float = 0.0):
        import torch

        x = np.array(self.seqs[np.sort(self.indices(step))], dtype=np.int64)
        if repeat_fraction > 0:
            _repeat_spans(x, repeat_fraction, np.random.default_rng(np.random.SeedSequence([self.seed, 0xC0B1, step])))
        return torch.from_numpy(x)


def _repeat_spans(x: np.ndarray, fraction: float, rng: np.random.Generator) -> None:
    """In place: in each row with probability ``fraction``, copy a span of L tokens (L uniform in
    [P/8, P/2]) to a later, non-overlapping place in the same row.

    Text repeats itself (names, idioms, whole lines of code), and a model that can look up what
    followed an earlier occurrence predicts it better; copying corpus spans makes such repeats
    frequent, so induction heads form within a small CPU budget. The copied text is corpus text:
    no token or sequence outside the corpus is introduced.
    """
    n, p = x.shape
    for i in range(n):
        if rng.random() >= fraction:
            continue
        length = int(rng.integers(max(1, p // 8), p // 2 + 1))
        src = int(rng.integers(0, p - 2 * length + 1))
        dst = int(rng.integers(src + length, p - length + 1))
        x[i, dst:dst + length] = x[i, src:src + length]


def load_tokens(path: str, vocab_size: int) -> np.ndarray:
    """A cached token stream (memory-mapped) after checking it holds token ids of this vocabulary:
    the cache is shared, and a planted file must not crash training or index out of range."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError):
        raise InputError(f"{path}: not a token file written by circuitstat (corrupt); delete it to rebuild") from None
    in_range = arr.ndim == 1 and arr.dtype.kind in "iu" and (
        arr.size == 0 or 0 <= int(arr.min()) <= int(arr.max()) < vocab_size)
    if not in_range:
        raise InputError(f"{path}: holds values that are not token ids of a {vocab_size}-token vocabulary; "
                         "delete it to rebuild")
    return arr


def chunk_tokens(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """Return ``tokens`` cut into rows of ``seq_len`` (the tail shorter than one row dropped: a training batch is whole)."""
    n = len(tokens) // seq_len
    return np.asarray(tokens[: n * seq_len]).reshape(n, seq_len)
