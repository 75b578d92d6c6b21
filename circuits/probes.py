"""Probe sets of head-stability analysis: token ids [N, T] of equal-length prompts and where they came from.

The prompts are tokenised with the models' tokenizer: held-out snippets of a corpus' probe split
(default) or a prompt file (one per line, ``.txt``, or ``{"text": ...}`` per line, ``.jsonl``).
Read by :class:`circuitstat.pipelines.runs.heads.stability.HeadStability` (and the audit's heads stage); nothing here needs torch.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from circuitstat.core.errors import InputError

__all__ = ["ProbeSet", "build_probe"]


@dataclass(frozen=True)
class ProbeSet:
    """Token ids [N, T] of the probe prompts (same length), and where they came from."""

    ids: np.ndarray
    bos: bool
    source: str
    n_dropped: int = 0
    tokenizer_hash: str | None = None

    def __post_init__(self) -> None:
        ids = np.asarray(self.ids, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[0] < 2 or ids.shape[1] < 2:
            raise InputError(f"the probe set must be [N >= 2, T >= 2] token ids, got shape {ids.shape}")
        ids.setflags(write=False)
        object.__setattr__(self, "ids", ids)

    @property
    def n(self) -> int:
        """Return the number of prompts."""
        return int(self.ids.shape[0])

    @property
    def length(self) -> int:
        """Return the tokens per prompt (BOS included)."""
        return int(self.ids.shape[1])

    @property
    def content_hash(self) -> str:
        """sha256 of the ids (shape and bytes) and the BOS flag."""
        h = hashlib.sha256(b"circuitstat-probe-v1")
        h.update(str(self.ids.shape).encode())
        h.update(b"bos" if self.bos else b"nobos")
        h.update(np.ascontiguousarray(self.ids).tobytes())
        return h.hexdigest()

    def describe(self) -> dict:
        """Return the JSON-able description recorded with the tables (size, BOS, source, sha256)."""
        return {"n": self.n, "length": self.length, "bos": self.bos, "source": self.source,
                "n_dropped": self.n_dropped, "tokenizer_hash": self.tokenizer_hash,
                "sha256": self.content_hash}

    @classmethod
    def from_ids(cls, ids: np.ndarray, bos: bool = False, source: str = "ids") -> "ProbeSet":
        """Return a probe set of given token ids (no tokenizer involved)."""
        return cls(np.asarray(ids), bool(bos), source)


def _read_prompt_file(path: Path) -> list[str]:
    """Return the prompts of a ``.txt`` (one per non-empty line) or ``.jsonl`` (``{"text": ...}``) file."""
    if not path.exists():
        raise InputError(f"probe file {path} does not exist")
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".jsonl":
        out = []
        for i, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                raise InputError(f"{path}:{i + 1} is not JSON; a .jsonl probe file needs one {{\"text\": ...}} per line") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
                raise InputError(f"{path}:{i + 1} has no string field 'text'")
            out.append(doc["text"])
        return out
    return [line for line in text.splitlines() if line.strip()]


def _first_token_rows(tokenizer, texts, body: int, n: int) -> tuple[list[list[int]], int]:
    """The first ``body`` tokens of the first ``n`` texts that have that many, and how many
    shorter texts were skipped on the way."""
    rows, dropped = [], 0
    for t in texts:
        ids = tokenizer.encode(t)
        if len(ids) < body:
            dropped += 1
            continue
        rows.append(ids[:body])
        if len(rows) == n:
            break
    return rows, dropped


def build_probe(tokenizer, *, n: int = 100, length: int = 64, bos: bool = True, file: str | os.PathLike | None = None,
                corpus: Any = None, seed: int = 0) -> ProbeSet:
    """``n`` prompts of exactly ``length`` tokens (BOS included when ``bos``).

    Default: held-out snippets of the corpus' probe split (``corpus``: a Corpus or a spec for
    ``load_corpus``; default the standard-library corpus), drawn deterministically with ``seed``;
    each is tokenised and cut to ``length`` tokens, snippets that are too short are skipped (in
    the order drawn, so the set is a pure function of the arguments). ``file``: one prompt per
    line (``.txt``) or ``{"text": ...}`` per line (``.jsonl``); prompts shorter than ``length``
    tokens are dropped (counted in ``n_dropped``), the first ``n`` others are kept.
    """
    if tokenizer is None:
        raise InputError("the models have no tokenizer; pass a probe set of token ids (ProbeSet.from_ids)")
    if n < 2:
        raise InputError(f"the probe set needs at least 2 prompts, got n={n}")
    bos_id = None
    if bos:
        bos_id = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
        if bos_id is None:
            raise InputError("the tokenizer has neither a BOS nor an EOS token; use bos=False (--no-bos)")
    body = length - (1 if bos else 0)
    if body < 1:
        raise InputError(f"probe length {length} leaves no room for tokens after BOS")
    thash = getattr(tokenizer, "content_hash", None)
    if file is not None:
        texts = _read_prompt_file(Path(file))
        source = f"file:{Path(file).name}"
        rows, dropped = _first_token_rows(tokenizer, texts, body, n)
        if len(rows) < min(n, 2):
            raise InputError(f"probe file {file}: only {len(rows)} prompts have >= {body} tokens; "
                               "lower the probe length or add longer prompts")
    else:
        from .corpus import load_corpus

        corp = load_corpus(corpus if corpus is not None else "stdlib")
        source = f"corpus:{corp.name}:{corp.content_hash[:16]}:probe-split:seed{seed}"
        n_chars = max(200, 8 * body)
        pool = 2 * n
        while True:
            texts = corp.probe_snippets(n=pool, n_chars=n_chars, seed=seed)  # a prefix-stable draw
            rows, dropped = _first_token_rows(tokenizer, texts, body, n)
            if len(rows) == n:
                break
            if pool >= 16 * n:
                raise InputError(f"could not draw {n} probe snippets of {body} tokens from corpus {corp.name!r}; "
                                   "lower n or the probe length")
            pool *= 2
    arr = np.asarray(rows, dtype=np.int64)
    if bos:
        arr = np.concatenate([np.full((arr.shape[0], 1), bos_id, dtype=np.int64), arr], axis=1)
    return ProbeSet(arr, bos, source, dropped, thash)
