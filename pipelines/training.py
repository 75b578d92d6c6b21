"""Multi-seed training of small GPT-style CircuitModels on a real corpus, deterministically.

One model per seed; the seed sets both the initialisation and the data order. Runs are bitwise
reproducible on the same machine and library versions (torch deterministic algorithms, a fixed
number of threads per model, no dropout, data order a pure function of (seed, step)), and a run
killed at any point resumes from its last checkpoint to exactly the weights an uninterrupted run
ends with (the checkpoint holds weights, optimizer state, RNG states and the step).

Layout of a model directory (loads with ``circuits.load_model(DIR)``)::

    DIR/config.json            model config + meta (seed, recipe, optimizer, corpus/tokenizer hashes, ...)
    DIR/model.safetensors      weights (config.json carries their sha256 as weight_hash)
    DIR/tokenizer.json ...     the tokenizer
    DIR/train_log.parquet      step, train loss, validation loss, lr, tokens, elapsed seconds
    DIR/token_counts.npy       how often each token id occurs in the training split
    DIR/checkpoint.safetensors only while training (removed when done unless keep_checkpoint);
                               tensors + a JSON header, never a pickle (see "Checkpoints" below)

Public entry points: :class:`TrainRecipe`, :func:`train_model`, :func:`train_models`,
:func:`parse_seeds` and :func:`check_out_dir` check the options of the ``train`` command (pipelines/cli/studies.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from circuits.cache import cache_dir  # noqa: F401  (re-exported: the zoo and the head study use it)
from circuits.errors import InputError

__all__ = [
    "TrainRecipe",
    "DataSpec",
    "train_model",
    "train_models",
    "prepare_data",
    "parse_seeds",
    "cache_dir",
    "model_dir_name",
    "is_complete",
]

CHECKPOINT = "checkpoint.safetensors"
LEGACY_CHECKPOINT = "checkpoint.pt"  # pickle format of older versions: never loaded
LOG_TABLE = "train_log.parquet"
FORMAT_VERSION = 2




@dataclass(frozen=True)
class TrainRecipe:
    """Everything that determines a trained model apart from its seed."""

    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 128
    d_head: int | None = None  # default d_model // n_heads
    d_mlp: int | None = None  # default 4 * d_model
    attn_only: bool = False
    n_ctx: int = 128
    norm: str = "layernorm"
    positional: str = "learned"
    act: str = "gelu_new"
    tokenizer: str = "bpe"  # "bpe" (trained on the corpus' train split), "gpt2", or a path
    vocab_size: int = 4096  # for tokenizer="bpe"
    corpus: str = "stdlib"  # "stdlib", a text folder/file or a Parquet file
    optimizer: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.99)
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    repeat_fraction: float = 0.0  # share of training sequences in which a span is copied later (see _repeat_spans)
    init_std: float | None = None  # None: CircuitModel.init_weights (GPT-2, std 0.02); else weight matrices rescaled to this std
    batch_size: int = 16
    steps: int = 1000
    eval_every: int = 100
    eval_batches: int = 8
    checkpoint_every: int = 100
    threads: int = 1

    def __post_init__(self) -> None:
        if self.optimizer not in ("adam", "adamw"):
            raise InputError(f"optimizer must be 'adam' or 'adamw', got {self.optimizer!r}")
        for name in ("n_layers", "n_heads", "d_model", "n_ctx", "batch_size", "steps", "threads",
                     "eval_every", "checkpoint_every", "eval_batches"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"training recipe: {name} must be a positive integer, got {getattr(self, name)!r}")
        if self.d_head is None and self.d_model % self.n_heads:
            raise InputError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; pass d_head")
        if not 0.0 <= self.repeat_fraction <= 1.0:
            raise InputError(f"repeat_fraction must be in [0, 1], got {self.repeat_fraction}")
        if self.init_std is not None and not self.init_std > 0:
            raise InputError(f"init_std must be positive, got {self.init_std}")
        if not (math.isfinite(self.lr) and math.isfinite(self.weight_decay)) or self.weight_decay < 0 or self.lr <= 0:
            raise InputError("training recipe: lr must be a positive finite number and weight_decay a "
                             "non-negative one")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))

    def validate(self, vocab_size: int | None = None, *, allow_large: bool = False) -> None:
        """None; raises InputError when the model config is invalid (norm, positional, activation) or
        training would need more memory than :mod:`circuits.limits` allows (``allow_large`` lifts it).

        ``vocab_size``: the prepared tokenizer's; before the data exists, the recipe's (a BPE's size).
        """
        from circuits.limits import check_bytes
        from circuits.loading import circuit_parameters

        vocab = int(vocab_size or self.vocab_size)
        cfg = self.model_config(vocab)  # ModelConfig checks norm, positional, act
        n = circuit_parameters(cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_mlp, vocab, cfg.n_ctx)
        # fp32 weights, gradients and two Adam moments, plus the logits of one batch (the largest activation)
        need = 16 * n + 3 * 4 * self.batch_size * self.n_ctx * (vocab + cfg.n_layers * cfg.n_heads * self.n_ctx)
        check_bytes(need, f"training a {n:,}-parameter model", allow_large=allow_large)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainRecipe":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise InputError(f"unknown training recipe keys {sorted(unknown)}; known: {sorted(known)}")
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return cls(**d)

    def replace(self, **kw) -> "TrainRecipe":
        return dataclasses.replace(self, **kw)

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    def model_config(self, vocab_size: int):
        from circuits.model import ModelConfig

        d_head = self.d_head or self.d_model // self.n_heads
        mlp = "none" if self.attn_only else "standard"
        d_mlp = 0 if self.attn_only else (self.d_mlp or 4 * self.d_model)
        return ModelConfig(
            n_layers=self.n_layers, n_heads=self.n_heads, d_model=self.d_model, d_head=d_head, d_mlp=d_mlp,
            vocab_size=int(vocab_size), n_ctx=self.n_ctx, norm=self.norm, positional=self.positional,
            mlp=mlp, act=self.act, parallel=False, arch="circuitstat",
        )


@dataclass(frozen=True)
class DataSpec:
    """Prepared, cached training data shared by all seeds (paths, so it crosses process boundaries)."""

    tokenizer_dir: str
    train_tokens: str
    val_tokens: str
    corpus_name: str
    corpus_hash: str
    tokenizer_hash: str
    vocab_size: int
    n_train_tokens: int
    token_counts: str = ""  # .npy of per-token-id counts in the train split

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(f"{self.corpus_hash}|{self.tokenizer_hash}".encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def _save_npy_atomic(path: Path, arr: np.ndarray) -> None:
    from reports.atomic import atomic_write

    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr))
    with atomic_write(path) as f:
        f.write(buf.getvalue())


def prepare_data(recipe: TrainRecipe, corpus=None, cache: str | os.PathLike | None = None) -> DataSpec:
    """Build (or reuse from the cache) the tokenizer and the train/validation token streams."""
    from circuits.corpus import load_corpus
    from circuits.tokenizers import load_tokenizer, train_bpe

    cache = Path(cache) if cache is not None else cache_dir()
    corpus = load_corpus(corpus if corpus is not None else recipe.corpus)
    chash = corpus.content_hash
    if recipe.tokenizer == "bpe":
        key = hashlib.sha256(f"bpe|{recipe.vocab_size}|{chash}".encode()).hexdigest()[:20]
        tdir = cache / "tokenizers" / f"bpe{recipe.vocab_size}-{key}"
        tok = load_tokenizer(tdir) if (tdir / "tokenizer.json").exists() else None
        if tok is None:
            tok = train_bpe(corpus.texts("train"), vocab_size=recipe.vocab_size,
                            name=f"bpe{recipe.vocab_size}-{corpus.name}")
            tok.save(tdir)
    else:
        tok = load_tokenizer(recipe.tokenizer)
        if tok is None:
            raise InputError(f"no tokenizer found at {recipe.tokenizer!r}")
        key = hashlib.sha256(tok.content_hash.encode()).hexdigest()[:20]
        tdir = cache / "tokenizers" / f"tok-{key}"
        if not (tdir / "tokenizer.json").exists():
            tok.save(tdir)
    tok_cache = cache / "tokens"
    paths = {}
    n_train = 0
    for split in ("train", "validation"):
        key = hashlib.sha256(f"{chash}|{tok.content_hash}|{split}".encode()).hexdigest()[:24]
        p = tok_cache / f"{split}-{key}.npy"
        if not p.exists():
            arr = corpus.tokens(tok, split)
            if tok.vocab_size > np.iinfo(np.int32).max:  # pragma: no cover
                raise InputError("vocabulary too large")
            _save_npy_atomic(p, arr.astype(np.int32))
        if split == "train":
            arr = np.load(p, mmap_mode="r", allow_pickle=False)
            n_train = int(arr.shape[0])
            cp = p.with_name(p.stem + "-counts.npy")
            if not cp.exists():
                _save_npy_atomic(cp, np.bincount(np.asarray(arr), minlength=tok.vocab_size).astype(np.int64))
            paths["counts"] = str(cp)
        paths[split] = str(p)
    return DataSpec(
        tokenizer_dir=str(tdir), train_tokens=paths["train"], val_tokens=paths["validation"],
        corpus_name=corpus.name, corpus_hash=chash, tokenizer_hash=tok.content_hash,
        vocab_size=int(tok.vocab_size), n_train_tokens=n_train, token_counts=paths["counts"],
    )


class _Batches:
    """Deterministic batches: the order of training sequences is a pure function of (seed, step)."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int):
        self.seqs = _chunk(tokens, seq_len)
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


def _load_tokens(path: str, vocab_size: int) -> np.ndarray:
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


def _chunk(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    n = len(tokens) // seq_len
    return np.asarray(tokens[: n * seq_len]).reshape(n, seq_len)


# --------------------------------------------------------------------------------------------
# Training one model
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _deterministic(threads: int) -> Iterator[None]:
    import torch

    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_threads = torch.get_num_threads()
    use_deterministic(warn_only=False)
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        _set_deterministic(prev_det, prev_warn)
        torch.set_num_threads(prev_threads)


def use_deterministic(warn_only: bool = True) -> None:
    """Switch torch to deterministic algorithms for the rest of the process, valid on CUDA too.

    cuBLAS is deterministic only with a fixed workspace (``CUBLAS_WORKSPACE_CONFIG``), read when
    cuBLAS initialises, so it is set here, before any model is loaded (a user's own value wins).
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    _set_deterministic(True, warn_only=warn_only)


def _set_deterministic(mode: bool, warn_only: bool = False) -> None:
    """``torch.use_deterministic_algorithms`` without its import of torch._inductor (seconds per
    process in torch 2.13); the inductor flag is set too when inductor is already loaded."""
    import sys

    import torch

    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None or "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        setter(mode, warn_only=warn_only)


GPT2_INIT_STD = 0.02


def _init(model, seed: int, init_std: float | None) -> None:
    """``model.init_weights(seed)`` (GPT-2 style, std 0.02 and 0.02/sqrt(2 n_layers) for output
    projections); with ``init_std`` every weight matrix is then scaled by init_std / 0.02.

    GPT-2's 0.02 suits d_model ~ 768; for a 64-wide model the attention scores start so close to
    uniform that attention heads take thousands of steps to specialise. 1/sqrt(d_model) (0.125
    at 64) keeps the same shape of initialisation at a width-appropriate scale.
    """
    import torch

    model.init_weights(seed)
    if init_std is None:
        return
    factor = float(init_std) / GPT2_INIT_STD
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1].startswith("W_"):
                p.mul_(factor)


def _lr_at(recipe: TrainRecipe, step: int) -> float:
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    span = max(1, recipe.steps - recipe.warmup_steps)
    frac = min(1.0, (step - recipe.warmup_steps) / span)
    cos = 0.5 * (1 + math.cos(math.pi * frac))
    return recipe.lr * (recipe.min_lr_ratio + (1 - recipe.min_lr_ratio) * cos)


def _make_optimizer(recipe: TrainRecipe, model):
    import torch

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        (no_decay if leaf.startswith("b_") or leaf.startswith(("ln", "lnf")) else decay).append(p)
    groups = [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if recipe.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=recipe.lr, betas=recipe.betas, foreach=False)
    # Adam with L2 regularisation (weight decay added to the gradient), as torch.optim.Adam does
    return torch.optim.Adam(groups, lr=recipe.lr, betas=recipe.betas, foreach=False)


def _loss(model, batch):
    import torch.nn.functional as F

    logits = model.fused_logits(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1))


def _eval_loss(model, val: np.ndarray, recipe: TrainRecipe, device) -> float:
    import torch

    seqs = _chunk(val, recipe.n_ctx + 1)
    n = min(len(seqs), recipe.eval_batches * recipe.batch_size)
    if n == 0:
        return float("nan")
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for s in range(0, n, recipe.batch_size):
            b = torch.from_numpy(np.asarray(seqs[s:min(n, s + recipe.batch_size)], dtype=np.int64)).to(device)
            total += float(_loss(model, b)) * b.shape[0]
            count += b.shape[0]
    model.train(was_training)
    return total / count


# --------------------------------------------------------------------------------------------
# Checkpoints: safetensors tensors + a JSON header, never a pickle
# --------------------------------------------------------------------------------------------
#
# A checkpoint lies in an output directory or the shared cache, where anyone may have put a
# file, so reading one must never run code. It is one safetensors file (written atomically):
# tensors ``model/NAME``, ``optim/PARAM/KEY``, ``rng/...`` and ``step``, and in the header's metadata one
# JSON document (format, version, recipe_hash, seed, data_hash, step, log, counters, optimizer
# param groups, the numpy and Python RNG states). The JSON is checked against the recipe before
# any tensor is read. A checkpoint of another recipe, seed or data is ignored with a warning and
# training starts again from step 0 (the same as a finished model of another recipe in that
# directory: it is retrained); a file that is not a circuitstat checkpoint is refused (InputError)
# rather than overwritten. A legacy pickle ``checkpoint.pt`` is never opened.

CHECKPOINT_FORMAT = "circuitstat-train-checkpoint"
_META_KEY = "circuitstat"


def _rng_state() -> tuple[dict, dict]:
    """(tensors, JSON) of the torch, numpy and Python RNG states."""
    import torch

    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    tensors = {"rng/torch": torch.get_rng_state(), "rng/numpy": torch.from_numpy(keys.astype(np.int64))}
    if torch.cuda.is_available():
        for i, st in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i}"] = st
    doc = {"numpy": [name, int(pos), int(has_gauss), float(cached)],
           "python": [version, list(internal), gauss_next]}
    return tensors, doc


def _set_rng_state(tensors: dict, doc: dict) -> None:
    import torch

    torch.set_rng_state(tensors["rng/torch"].cpu())
    name, pos, has_gauss, cached = doc["numpy"]
    np.random.set_state((name, tensors["rng/numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = doc["python"]
    random.setstate((version, tuple(internal), gauss_next))
    cuda = [tensors[k].cpu() for k in sorted(k for k in tensors if k.startswith("rng/cuda/"))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def _save_checkpoint(path: Path, model, opt, info: dict) -> None:
    """Write model, optimizer and RNG state plus ``info`` (JSON-able) atomically to ``path``."""
    import torch
    from safetensors.torch import save

    from reports.atomic import atomic_write

    tensors = {f"model/{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    osd = opt.state_dict()
    scalars: dict = {}
    for pid, st in osd["state"].items():
        for key, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"optim/{pid}/{key}"] = v.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(pid), {})[key] = v
    rng_tensors, rng_doc = _rng_state()
    tensors.update(rng_tensors)
    # the step also as a tensor: torch.load(CHECKPOINT)["step"] works too (torch reads safetensors)
    tensors["step"] = torch.tensor(int(info["step"]), dtype=torch.int64)
    doc = {**info, "format": CHECKPOINT_FORMAT, "format_version": FORMAT_VERSION, "rng": rng_doc,
           "optimizer": {"param_groups": osd["param_groups"], "scalars": scalars}}
    data = save(tensors, metadata={_META_KEY: json.dumps(doc)})
    with atomic_write(path) as f:
        f.write(data)


def read_checkpoint_info(path: str | os.PathLike) -> dict:
    """The JSON part of a training checkpoint (step, log, hashes, ...); reads no tensor.

    Raises InputError when ``path`` is not a circuitstat training checkpoint.
    """
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        doc = json.loads(meta[_META_KEY])
        ok = isinstance(doc, dict) and doc.get("format") == CHECKPOINT_FORMAT
    except Exception:  # noqa: BLE001 - every kind of corrupt or foreign file is the same bad input
        ok = False
    if not ok:
        raise InputError(f"{path} is not a circuitstat training checkpoint (corrupt or foreign file); "
                         "delete it to train from step 0, or choose another --out")
    if doc.get("format_version") != FORMAT_VERSION:
        raise InputError(f"{path}: checkpoint format version {doc.get('format_version')!r} is not "
                         f"{FORMAT_VERSION}; delete it to train from step 0")
    return doc


def _restore_checkpoint(path: Path, doc: dict, model, opt, recipe: "TrainRecipe", device) -> dict:
    """Load a checked checkpoint into ``model``, ``opt`` and the RNGs; returns its counters
    (step, log, elapsed_s, run_loss, run_n, cpu_s). InputError when anything in it does not fit."""
    try:
        return _restore(path, doc, model, opt, recipe, device)
    except InputError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError):
        raise InputError(f"{path}: the checkpoint does not fit this recipe's model and optimizer (edited or "
                         "corrupt); delete it to train from step 0") from None


def _fits(shapes: dict[str, tuple[int, ...]], model, opt) -> bool:
    """Whether a checkpoint's tensor shapes are exactly the model's plus Adam(W) state of its parameters."""
    model_shapes = {f"model/{k}": tuple(v.shape) for k, v in model.state_dict().items()}
    if {k: v for k, v in shapes.items() if k.startswith("model/")} != model_shapes:
        return False
    params = [tuple(p.shape) for g in opt.param_groups for p in g["params"]]
    state_shape = {"step": lambda s: (), "exp_avg": lambda s: s, "exp_avg_sq": lambda s: s}
    for k, shape in shapes.items():
        if k.startswith(("model/", "rng/")) or (k == "step" and shape == ()):
            continue
        parts = k.split("/")
        if (len(parts) != 3 or parts[0] != "optim" or not parts[1].isdigit() or int(parts[1]) >= len(params)
                or parts[2] not in state_shape or state_shape[parts[2]](params[int(parts[1])]) != shape):
            return False
    return True


def _restore(path: Path, doc: dict, model, opt, recipe: "TrainRecipe", device) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        if not _fits(shapes, model, opt):
            raise InputError(f"{path}: the checkpoint's tensors do not fit the recipe's model; delete it to "
                             "train from step 0")
        tensors = {k: f.get_tensor(k) for k in shapes}
    counters = {"step": int(doc["step"]), "log": list(doc["log"]), "elapsed_s": float(doc["elapsed_s"]),
                "run_loss": float(doc["run_loss"]), "run_n": int(doc["run_n"]), "cpu_s": float(doc.get("cpu_s", 0.0))}
    if (not 0 < counters["step"] < recipe.steps or int(tensors["step"]) != counters["step"]
            or not all(isinstance(r, dict) for r in counters["log"])):
        raise ValueError("step or log out of range")
    model.load_state_dict({k[len("model/"):]: v.to(device) for k, v in tensors.items() if k.startswith("model/")})
    state: dict = {}
    for k, v in tensors.items():
        if k.startswith("optim/"):
            _, pid, key = k.split("/", 2)
            state.setdefault(int(pid), {})[key] = v.to(device)
    opt_doc = doc["optimizer"]
    fresh_groups = opt.state_dict()["param_groups"]
    if len(opt_doc["param_groups"]) != len(fresh_groups):
        raise ValueError("parameter groups differ")
    # JSON turned tuples (betas) into lists: give every value the fresh group's type back
    groups = [{k: tuple(v) if isinstance(fresh.get(k), tuple) else v for k, v in saved.items()}
              for saved, fresh in zip(opt_doc["param_groups"], fresh_groups)]
    opt.load_state_dict({"state": state, "param_groups": groups})
    _set_rng_state({k: v for k, v in tensors.items() if k.startswith("rng/")}, doc["rng"])
    return counters


def _resume_state(ck: Path, recipe: "TrainRecipe", seed: int, data_hash: str) -> dict | None:
    """The checkpoint's JSON when it is this run's (recipe, seed, data), else None (with a warning).

    Raises InputError for a file that is not a circuitstat checkpoint. A legacy pickle checkpoint
    next to it is never opened (unpickling can run code): it is reported and ignored.
    """
    import warnings

    legacy = ck.with_name(LEGACY_CHECKPOINT)
    if legacy.exists():
        warnings.warn(f"{legacy}: a pickle checkpoint is never loaded (unpickling can run code); "
                      "ignored, delete it", stacklevel=3)
    if not ck.exists():
        return None
    doc = read_checkpoint_info(ck)
    if (doc.get("recipe_hash"), doc.get("seed"), doc.get("data_hash")) != (recipe.content_hash, int(seed), data_hash):
        warnings.warn(f"{ck}: checkpoint of another recipe, seed or data; training starts from step 0 and "
                      "replaces it", stacklevel=3)
        return None
    return doc


def _write_log(out: Path, rows: list[dict], provenance: dict) -> None:
    import pyarrow as pa

    cols = ["step", "train_loss", "val_loss", "lr", "tokens", "elapsed_s"]
    table = pa.table({c: [r[c] for r in rows] for c in cols},
                     schema=pa.schema([("step", pa.int64()), ("train_loss", pa.float64()), ("val_loss", pa.float64()),
                                       ("lr", pa.float64()), ("tokens", pa.int64()), ("elapsed_s", pa.float64())]))
    from reports.tables import write_table

    write_table(table, out / LOG_TABLE, provenance=provenance)


def model_dir_name(seed: int) -> str:
    return f"seed-{int(seed)}"


def is_complete(directory: str | os.PathLike, recipe: TrainRecipe | None = None, seed: int | None = None,
                data_hash: str | None = None) -> bool:
    """Whether ``directory`` holds a finished model (of this recipe/seed/data, when given).

    A model trained before TrainRecipe gained fields still counts as this recipe's when every
    field it stored equals the recipe's and every field it lacks is at its default (the default
    reproduces the older behaviour), so caches survive new recipe options.
    """
    cfg = Path(directory) / "config.json"
    if not cfg.exists() or not (Path(directory) / "model.safetensors").exists():
        return False
    try:
        meta = json.loads(cfg.read_text()).get("meta", {})
    except (ValueError, OSError):
        return False
    t = meta.get("training", {})
    if not t.get("complete"):
        return False
    if recipe is not None and t.get("recipe_hash") != recipe.content_hash:
        stored, now, base = t.get("recipe") or {}, recipe.to_dict(), TrainRecipe().to_dict()
        if not (stored and all(now.get(k) == v for k, v in stored.items())
                and all(now[k] == base[k] for k in now if k not in stored)):
            return False
    if seed is not None and t.get("seed") != int(seed):
        return False
    if data_hash is not None and t.get("data_hash") != data_hash:
        return False
    return True


def _finish(model, out: Path, recipe: TrainRecipe, seed: int, data: DataSpec, log: list[dict], device: str,
            keep_checkpoint: bool, *, train_seconds: float, cpu_seconds: float) -> None:
    """Save the trained model with its training record (and token counts); drop the checkpoint."""
    import torch

    meta = {
        "training": {
            "complete": True, "seed": seed, "recipe": recipe.to_dict(), "recipe_hash": recipe.content_hash,
            "data_hash": data.content_hash, "corpus": data.corpus_name, "corpus_hash": data.corpus_hash,
            "tokenizer_hash": data.tokenizer_hash, "steps": recipe.steps,
            "tokens": recipe.steps * recipe.batch_size * recipe.n_ctx,
            "optimizer": {"name": recipe.optimizer, "lr": recipe.lr, "weight_decay": recipe.weight_decay,
                          "betas": list(recipe.betas), "warmup_steps": recipe.warmup_steps,
                          "schedule": "linear warmup, cosine decay", "min_lr_ratio": recipe.min_lr_ratio,
                          "grad_clip": recipe.grad_clip},
            "final_val_loss": log[-1]["val_loss"] if log else None,
            "train_seconds": round(train_seconds, 3),
            "cpu_seconds": round(cpu_seconds, 3),
            "threads": recipe.threads, "device": str(device),
            "torch": torch.__version__, "deterministic": True,
            "forward": "sdpa" if model.has_fused_forward else "circuitmodel",
        }
    }
    model.save(out, meta=meta)
    if data.token_counts and Path(data.token_counts).exists():
        # which tokens the model saw how often (e.g. to draw induction tokens it was trained on)
        _save_npy_atomic(out / "token_counts.npy", np.load(data.token_counts, allow_pickle=False))
    ck = out / CHECKPOINT
    if not keep_checkpoint and ck.exists():
        ck.unlink()


def train_model(
    recipe: TrainRecipe,
    seed: int,
    out_dir: str | os.PathLike,
    data: DataSpec | None = None,
    device: str = "cpu",
    progress: bool = True,
    keep_checkpoint: bool = False,
    stop_after: int | None = None,
    cache: str | os.PathLike | None = None,
    allow_large: bool = False,
) -> Path:
    """Train one model into ``out_dir`` (resuming from its checkpoint if one is there).

    ``stop_after`` stops (after checkpointing) once that many steps are done, as a kill would; a
    later call resumes. A finished model of the same recipe, seed and data is returned untouched.
    """
    import torch
    from tqdm.auto import tqdm

    from circuits.model import CircuitModel
    from circuits.tokenizers import load_tokenizer

    out = check_out_dir(out_dir)
    recipe.validate(allow_large=allow_large)
    data = data or prepare_data(recipe, cache=cache)
    if is_complete(out, recipe, seed, data.content_hash):
        return out
    recipe.validate(data.vocab_size, allow_large=allow_large)
    out.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(data.tokenizer_dir)
    train_tokens = _load_tokens(data.train_tokens, data.vocab_size)
    val_tokens = np.asarray(_load_tokens(data.val_tokens, data.vocab_size))
    t_start = time.time()
    c_start = time.process_time()

    with _deterministic(recipe.threads):
        model = CircuitModel(recipe.model_config(data.vocab_size))
        _init(model, int(seed), recipe.init_std)
        model.to(device).train()
        opt = _make_optimizer(recipe, model)
        batches = _Batches(train_tokens, recipe.n_ctx + 1, recipe.batch_size, seed)
        step, log, elapsed0, run_loss, run_n, cpu0 = 0, [], 0.0, 0.0, 0, 0.0
        ck = out / CHECKPOINT
        resume = _resume_state(ck, recipe, seed, data.content_hash)
        if resume is not None:
            c = _restore_checkpoint(ck, resume, model, opt, recipe, device)
            step, log, elapsed0, run_loss, run_n, cpu0 = (c[k] for k in ("step", "log", "elapsed_s", "run_loss",
                                                                         "run_n", "cpu_s"))
        prov = {
            "model": {"name": out.name, "seed": int(seed)},
            "data": {"corpus": data.corpus_name, "corpus_hash": data.corpus_hash,
                     "tokenizer_hash": data.tokenizer_hash},
            "params": recipe.to_dict(), "seed": int(seed), "method": "train",
        }
        bar = tqdm(total=recipe.steps, initial=step, desc=f"train seed {seed}", disable=not progress,
                   mininterval=1.0, leave=False, dynamic_ncols=True)

        def checkpoint() -> None:
            _save_checkpoint(ck, model, opt, {
                "step": step, "log": log, "elapsed_s": elapsed0 + time.time() - t_start,
                "run_loss": run_loss, "run_n": run_n, "recipe_hash": recipe.content_hash, "seed": int(seed),
                "cpu_s": cpu0 + time.process_time() - c_start, "data_hash": data.content_hash,
            })

        while step < recipe.steps:
            lr = _lr_at(recipe, step)
            for g in opt.param_groups:
                g["lr"] = lr
            batch = batches.batch(step, recipe.repeat_fraction).to(device)
            loss = _loss(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if recipe.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip, foreach=False)
            opt.step()
            step += 1
            lv = float(loss.detach())
            if not math.isfinite(lv):
                raise InputError(f"training diverged at step {step} (loss {lv}); lower --lr (now {recipe.lr:g})")
            run_loss += lv
            run_n += 1
            bar.update(1)
            if step % recipe.eval_every == 0 or step == recipe.steps:
                val = _eval_loss(model, val_tokens, recipe, device)
                log.append({"step": step, "train_loss": run_loss / max(run_n, 1), "val_loss": val, "lr": lr,
                            "tokens": step * recipe.batch_size * recipe.n_ctx,
                            "elapsed_s": elapsed0 + time.time() - t_start})
                run_loss, run_n = 0.0, 0
                bar.set_postfix(val_loss=f"{val:.3f}")
                _write_log(out, log, prov)
            if step % recipe.checkpoint_every == 0 and step < recipe.steps:
                checkpoint()
            if stop_after is not None and step >= stop_after and step < recipe.steps:
                checkpoint()
                bar.close()
                return out
        bar.close()

        model.eval()
        model.tokenizer = tok
        _finish(model, out, recipe, int(seed), data, log, device, keep_checkpoint,
                train_seconds=elapsed0 + time.time() - t_start, cpu_seconds=cpu0 + time.process_time() - c_start)
    return out


def _train_worker(recipe_dict: dict, seed: int, out: str, data: DataSpec, device: str, progress: bool,
                  allow_large: bool = False) -> str:
    return str(train_model(TrainRecipe.from_dict(recipe_dict), seed, out, data=data, device=device, progress=progress,
                           allow_large=allow_large))


@dataclass(frozen=True)
class TrainJob:
    """One model to train: recipe, seed, output directory and its prepared data."""

    recipe: TrainRecipe
    seed: int
    out: Path
    data: DataSpec

    def cost(self) -> float:
        """Relative training cost for scheduling: steps x depth x (1 + MLP share, measured on CPU)."""
        r = self.recipe
        return r.steps * r.n_layers * (1.0 if r.attn_only else 1.25)


def run_train_jobs(jobs: Sequence[TrainJob], n_jobs: int = 1, device: str = "cpu", progress: bool = False,
                   allow_large: bool = False) -> list[Path]:
    """Train the jobs not yet complete (one joblib pool, longest first); return every job's directory.

    The one training job runner (zoo, head study, ``train``): each worker uses its recipe's
    threads, so the models do not depend on ``n_jobs``; finished models are kept and
    interrupted ones resume from their checkpoints.
    """
    todo = [j for j in jobs if not is_complete(j.out, j.recipe, j.seed, j.data.content_hash)]
    todo.sort(key=lambda j: -j.cost())  # longest first: the workers finish together
    n_jobs = max(1, min(int(n_jobs), len(todo)))
    if todo and n_jobs == 1:
        for j in todo:
            train_model(j.recipe, j.seed, j.out, data=j.data, device=device, progress=progress,
                        allow_large=allow_large)
    elif todo:
        from joblib import Parallel, delayed

        Parallel(n_jobs=n_jobs, backend="loky")(
            delayed(_train_worker)(j.recipe.to_dict(), j.seed, str(j.out), j.data, device, progress, allow_large)
            for j in todo)
    return [Path(j.out) for j in jobs]


def train_models(
    recipe: TrainRecipe,
    seeds: Sequence[int],
    out_dir: str | os.PathLike,
    n_jobs: int = 1,
    corpus=None,
    device: str = "cpu",
    progress: bool = True,
    cache: str | os.PathLike | None = None,
    allow_large: bool = False,
) -> list[Path]:
    """Train one model per seed into ``out_dir/seed-{s}``, seeds in parallel with joblib.

    Each worker uses ``recipe.threads`` threads, so results do not depend on ``n_jobs``.
    Finished models are kept; interrupted ones resume from their checkpoints. The recipe and the
    output folder are checked before anything is written (``allow_large`` lifts the memory limit).
    """
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise InputError("no seeds given; pass e.g. --seeds 0-4")
    if len(set(seeds)) != len(seeds):
        raise InputError(f"duplicate seeds in {seeds}")
    out = check_out_dir(out_dir)
    recipe.validate(allow_large=allow_large)  # before the (slow) data preparation
    data = prepare_data(recipe, corpus=corpus, cache=cache)
    recipe.validate(data.vocab_size, allow_large=allow_large)
    for s in seeds:  # a foreign file under a checkpoint's name is refused before anything is written
        if (out / model_dir_name(s) / CHECKPOINT).exists():
            read_checkpoint_info(out / model_dir_name(s) / CHECKPOINT)
    out.mkdir(parents=True, exist_ok=True)
    (out / "recipe.json").write_text(json.dumps({"recipe": recipe.to_dict(), "seeds": seeds,
                                                 "data": asdict(data)}, indent=2))
    jobs = [TrainJob(recipe, s, out / model_dir_name(s), data) for s in seeds]
    return run_train_jobs(jobs, n_jobs, device=device, progress=progress, allow_large=allow_large)


# --------------------------------------------------------------------------------------------
# Checks of the train command's options (the command is in pipelines/cli)
# --------------------------------------------------------------------------------------------


MAX_SEEDS = 1000
"""Most seeds one ``train`` may ask for unless ``--allow-large`` lifts the limit."""


def parse_seeds(spec: str | int | Sequence[int], *, allow_large: bool = False) -> list[int]:
    """``"0-4"`` -> [0..4]; ``"0,2,7"``; ``"3"``; combinations like ``"0-2,10"``.

    The count is checked against :data:`MAX_SEEDS` before any list is built (``allow_large`` lifts it).
    """
    from circuits.limits import check_count

    if isinstance(spec, int):
        return [spec]
    if not isinstance(spec, str):
        return [int(s) for s in spec]
    ranges: list[tuple[int, int]] = []
    try:
        for part in spec.replace(" ", "").split(","):
            if not part:
                continue
            if "-" in part[1:]:
                a, b = part.split("-", 1) if not part.startswith("-") else (part, "")
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise ValueError
                ranges.append((lo, hi))
            else:
                ranges.append((int(part), int(part)))
    except ValueError:
        raise InputError(f"malformed seeds {spec!r}; use e.g. '0-4', '0,2,5' or '3'") from None
    check_count(sum(hi - lo + 1 for lo, hi in ranges), MAX_SEEDS, f"the number of seeds in {spec!r}",
                allow_large=allow_large)
    out = [s for lo, hi in ranges for s in range(lo, hi + 1)]
    if not out:
        raise InputError(f"no seeds in {spec!r}; use e.g. '0-4'")
    if len(set(out)) != len(out):
        raise InputError(f"duplicate seeds in {spec!r}")
    return out


def check_out_dir(out: str | os.PathLike) -> Path:
    """``out`` as a Path; InputError when it (or a parent) exists and is not a directory."""
    p = Path(out).expanduser()
    for q in (p, *p.parents):
        if q.exists():
            if not q.is_dir():
                raise InputError(f"--out {out}: {q} exists and is not a directory; choose another --out")
            break
    return p
