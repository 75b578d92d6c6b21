"""Tasks: clean/corrupted prompt pairs with answers, validated before any model runs.

A :class:`Task` holds, for N examples:

* ``clean`` / ``corrupted``: ``[N, P]`` int64 token ids, right-padded; each pair has the same
  number of real tokens, so one ``attention_mask`` ``[N, P]`` (1 = real token) serves both;
* ``answer`` / ``wrong_answer``: ``[N]`` int64 single-token ids, read at ``last_pos`` (the last
  real token of each prompt);
* ``group``: optional ``[N]`` int64 (template id), for cluster bootstraps;
* ``metric``: a metric name (:mod:`circuits.metrics`) or a user callable;
* optional candidate sets (``candidates [K]``, ``good``/``bad`` ``[N, K]``) for set-valued
  metrics such as greater-than's probability difference;
* ``content_hash``: sha256 over all of the above.

Built-ins (:func:`make_task`): ``induction``, ``ioi``, ``greater-than`` and ``file`` (JSONL, CSV
or Parquet with columns ``clean, corrupted, answer, wrong_answer[, group]``). Bad input raises
:class:`TaskValidationError` naming the rows and the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from circuits.errors import InputError
from circuits.metrics import Metric, get_metric

__all__ = [
    "Task",
    "TaskValidationError",
    "make_task",
    "register_task",
    "TASKS",
    "induction_task",
    "ioi_task",
    "greater_than_task",
    "file_task",
    "task_from_texts",
    "task_from_token_lists",
    "IOI_TEMPLATES",
    "IOI_NAMES",
]

_MAX_ROWS_SHOWN = 10


class TaskValidationError(InputError):
    """A task's data is unusable; the message names the rows and the fix."""


def check_int(what: str, value: Any, minimum: int | None = None) -> int:
    """``value`` as an int; TaskValidationError when it is not an integer (a bool, a decimal number
    or a quoted number is refused, never coerced) or is below ``minimum``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TaskValidationError(f"{what} must be an integer, got a {type(value).__name__}; "
                                  "write it as a whole number without quotes or decimals")
    if minimum is not None and value < minimum:
        raise TaskValidationError(f"{what} must be at least {minimum}, got {int(value)}")
    return int(value)


def check_token_ids(what: str, values: Any) -> list[int]:
    """``values`` (a list of integer token ids) as ints; TaskValidationError naming the first entry
    that is not a non-negative integer (decimals are refused, not truncated)."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise TaskValidationError(f"{what} must be a list of integer token ids, got a {type(values).__name__}")
    out = []
    for i, v in enumerate(values):
        out.append(check_int(f"{what}[{i}]", v.item() if isinstance(v, np.generic) else v, minimum=0))
    return out


def _check_bool(what: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TaskValidationError(f"{what} must be true or false, got a {type(value).__name__}")
    return bool(value)


def _rows_str(rows: Sequence[int]) -> str:
    rows = list(rows)
    s = ", ".join(str(r) for r in rows[:_MAX_ROWS_SHOWN])
    return s + (f", ... ({len(rows)} rows in all)" if len(rows) > _MAX_ROWS_SHOWN else "")


@dataclass(eq=False)
class Task:
    name: str
    clean: torch.Tensor
    corrupted: torch.Tensor
    attention_mask: torch.Tensor
    answer: torch.Tensor
    wrong_answer: torch.Tensor
    group: torch.Tensor | None = None
    metric: "str | Callable | Metric" = "logit_diff"
    metric_kwargs: dict = field(default_factory=dict)
    candidates: torch.Tensor | None = None
    good: torch.Tensor | None = None
    bad: torch.Tensor | None = None
    prompts: list[str] | None = None
    corrupted_prompts: list[str] | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.clean = torch.as_tensor(self.clean, dtype=torch.long)
        self.corrupted = torch.as_tensor(self.corrupted, dtype=torch.long)
        self.attention_mask = torch.as_tensor(self.attention_mask, dtype=torch.long)
        self.answer = torch.as_tensor(self.answer, dtype=torch.long).reshape(-1)
        self.wrong_answer = torch.as_tensor(self.wrong_answer, dtype=torch.long).reshape(-1)
        if self.group is not None:
            self.group = torch.as_tensor(self.group, dtype=torch.long).reshape(-1)
        if self.candidates is not None:
            self.candidates = torch.as_tensor(self.candidates, dtype=torch.long).reshape(-1)
            self.good = torch.as_tensor(self.good, dtype=torch.bool)
            self.bad = torch.as_tensor(self.bad, dtype=torch.bool)
        self._check_structure()
        self._hash: str | None = None
        self._metric_obj: Metric | None = None
        self.metric_fn  # noqa: B018 - an unknown metric or metric option fails here, before any model runs

    # -- validation --------------------------------------------------------------------------
    def _check_structure(self) -> None:
        n = self.clean.shape[0] if self.clean.ndim >= 1 else 0
        if self.clean.ndim != 2 or n == 0 or self.clean.shape[1] == 0:
            raise TaskValidationError(
                f"task {self.name!r} is empty (clean ids have shape {tuple(self.clean.shape)}); "
                "a task needs at least one example with at least one token"
            )
        for nm in ("corrupted", "attention_mask"):
            t = getattr(self, nm)
            if t.shape != self.clean.shape:
                raise TaskValidationError(
                    f"task {self.name!r}: {nm} has shape {tuple(t.shape)} but clean ids have "
                    f"{tuple(self.clean.shape)}; clean and corrupted prompts must be the same token length"
                )
        for nm in ("answer", "wrong_answer", "group"):
            t = getattr(self, nm)
            if t is not None and t.shape != (n,):
                raise TaskValidationError(f"task {self.name!r}: {nm} has shape {tuple(t.shape)}, expected ({n},)")
        m = self.attention_mask
        if not bool(((m == 0) | (m == 1)).all()):
            raise TaskValidationError(f"task {self.name!r}: attention_mask must contain only 0 and 1")
        lengths = m.sum(1)
        empty = torch.nonzero(lengths == 0).flatten().tolist()
        if empty:
            raise TaskValidationError(f"task {self.name!r}: rows {_rows_str(empty)} have no tokens; drop them")
        ar = torch.arange(m.shape[1]).unsqueeze(0)
        not_right = torch.nonzero(((ar < lengths.unsqueeze(1)).long() != m).any(1)).flatten().tolist()
        if not_right:
            raise TaskValidationError(
                f"task {self.name!r}: rows {_rows_str(not_right)} are not right-padded (mask must be "
                "1...1 0...0); pad prompts on the right"
            )
        if self.candidates is not None:
            k = self.candidates.shape[0]
            for nm in ("good", "bad"):
                t = getattr(self, nm)
                if t is None or t.shape != (n, k):
                    raise TaskValidationError(f"task {self.name!r}: {nm} must be [N, K] = ({n}, {k})")
        for nm, t in (("answer", self.answer), ("wrong_answer", self.wrong_answer)):
            neg = torch.nonzero(t < 0).flatten().tolist()
            if neg:
                raise TaskValidationError(f"task {self.name!r}: {nm} is negative in rows {_rows_str(neg)}")

    def validate(self, model=None, vocab_size: int | None = None, n_ctx: int | None = None) -> "Task":
        """Check the task against a model (or a vocabulary size / context length) before running it:
        every id within the vocabulary, every prompt within the context. Returns self."""
        if model is not None:
            cfg = getattr(model, "cfg", None) or getattr(model, "config", None)
            vocab_size = vocab_size or getattr(cfg, "vocab_size", None)
            n_ctx = n_ctx or getattr(cfg, "n_ctx", None) or getattr(cfg, "max_position_embeddings", None)
        if vocab_size is not None:
            real = self.attention_mask.bool()
            for nm, ids in (("clean", self.clean), ("corrupted", self.corrupted)):
                bad = torch.nonzero(((ids >= vocab_size) & real).any(1)).flatten().tolist()
                if bad:
                    raise TaskValidationError(
                        f"task {self.name!r}: {nm} prompts in rows {_rows_str(bad)} contain token ids "
                        f">= the model's vocabulary size {vocab_size}; build the task with the model's tokenizer"
                    )
            for nm, t in (("answer", self.answer), ("wrong_answer", self.wrong_answer)):
                bad = torch.nonzero(t >= vocab_size).flatten().tolist()
                if bad:
                    raise TaskValidationError(
                        f"task {self.name!r}: {nm} ids in rows {_rows_str(bad)} are >= the vocabulary "
                        f"size {vocab_size}; build the task with the model's tokenizer"
                    )
        if n_ctx is not None and self.n_positions > n_ctx:
            long_rows = torch.nonzero(self.lengths > n_ctx).flatten().tolist()
            raise TaskValidationError(
                f"task {self.name!r}: rows {_rows_str(long_rows)} are longer than the model's context "
                f"of {n_ctx} tokens; shorten them"
            )
        return self

    # -- shape and access --------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.clean.shape[0])

    @property
    def n(self) -> int:
        return len(self)

    @property
    def n_positions(self) -> int:
        return int(self.clean.shape[1])

    @property
    def lengths(self) -> torch.Tensor:
        return self.attention_mask.sum(1)

    @property
    def last_pos(self) -> torch.Tensor:
        """``[N]`` index of each example's last real token (where metrics are read)."""
        return self.attention_mask.sum(1) - 1

    def select(self, indices) -> "Task":
        """A task of the given rows (a tensor, list, slice or boolean mask); trailing all-padding
        columns are kept so positions stay comparable."""
        if isinstance(indices, slice):
            idx = torch.arange(len(self))[indices]
        else:
            idx = torch.as_tensor(indices)
            if idx.dtype == torch.bool:
                idx = torch.nonzero(idx).flatten()
            idx = idx.long().reshape(-1).cpu()

        def take(t):
            return None if t is None else t[idx]

        def take_list(xs):
            return None if xs is None else [xs[i] for i in idx.tolist()]

        return replace(
            self,
            clean=self.clean[idx], corrupted=self.corrupted[idx], attention_mask=self.attention_mask[idx],
            answer=self.answer[idx], wrong_answer=self.wrong_answer[idx], group=take(self.group),
            good=take(self.good), bad=take(self.bad),
            prompts=take_list(self.prompts), corrupted_prompts=take_list(self.corrupted_prompts),
            meta={**self.meta, "subset_of": self.content_hash},
        )

    def batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, "Task"]]:
        """Yield ``(indices, sub_task)`` in order, ``batch_size`` rows at a time."""
        if batch_size < 1:
            raise TaskValidationError(f"batch_size must be positive, got {batch_size}")
        for s in range(0, len(self), batch_size):
            idx = torch.arange(s, min(s + batch_size, len(self)))
            yield idx, self.select(idx)

    def to(self, device) -> "Task":
        def mv(t):
            return None if t is None else t.to(device)

        out = replace(
            self, clean=mv(self.clean), corrupted=mv(self.corrupted), attention_mask=mv(self.attention_mask),
            answer=mv(self.answer), wrong_answer=mv(self.wrong_answer), group=mv(self.group),
            candidates=mv(self.candidates), good=mv(self.good), bad=mv(self.bad),
        )
        out._hash = self._hash
        return out

    # -- metric ------------------------------------------------------------------------------
    @property
    def metric_fn(self) -> Metric:
        if self._metric_obj is None:
            self._metric_obj = get_metric(self.metric, **self.metric_kwargs)
        return self._metric_obj

    @property
    def metric_name(self) -> str:
        return self.metric_fn.name

    def score(self, logits, indices=None, clean_logits=None) -> torch.Tensor:
        """The task's metric per example: ``logits`` has one row per selected example."""
        return self.metric_fn(logits, self, clean_logits, indices)

    # -- identity ----------------------------------------------------------------------------
    @property
    def content_hash(self) -> str:
        """sha256 over the ids, mask, answers, groups, candidate sets and metric (name + kwargs);
        the task's name is not part of it."""
        if self._hash is None:
            h = hashlib.sha256(b"circuitstat-task-v1")  # content only: the name is not hashed
            for t in (self.clean, self.corrupted, self.attention_mask, self.answer, self.wrong_answer,
                      self.group, self.candidates, self.good, self.bad):
                if t is None:
                    h.update(b"\x00none")
                    continue
                a = np.ascontiguousarray(t.detach().cpu().numpy())
                h.update(a.dtype.str.encode() + repr(a.shape).encode())
                h.update(a.tobytes())
            h.update(json.dumps(self.metric_fn.describe(), sort_keys=True, default=str).encode())
            self._hash = h.hexdigest()
        return self._hash

    def describe(self) -> dict:
        """A JSON-safe summary for provenance."""
        return {
            "name": self.name, "n": len(self), "n_positions": self.n_positions,
            "metric": self.metric_fn.describe(), "content_hash": self.content_hash,
            "n_groups": None if self.group is None else int(self.group.unique().numel()),
            "meta": {k: v for k, v in self.meta.items() if isinstance(v, (str, int, float, bool, type(None), list, dict))},
        }

    def __repr__(self) -> str:
        return (f"Task({self.name!r}, n={len(self)}, positions={self.n_positions}, metric={self.metric_name!r}, "
                f"hash={self.content_hash[:12]})")


# --------------------------------------------------------------------------------------------
# Construction from token lists / texts (with validation)
# --------------------------------------------------------------------------------------------


def _pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    p = max(len(r) for r in rows)
    ids = torch.full((len(rows), p), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), p), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def task_from_token_lists(
    name: str,
    clean: Sequence[Sequence[int]],
    corrupted: Sequence[Sequence[int]],
    answer: Sequence[int],
    wrong_answer: Sequence[int],
    group: Sequence[int] | None = None,
    pad_id: int = 0,
    **kw,
) -> Task:
    """Build a right-padded :class:`Task` from per-example token lists, validating lengths."""
    n = len(clean)
    if n == 0:
        raise TaskValidationError(f"task {name!r} has no examples (empty data); provide at least one row")
    sizes = {"corrupted": len(corrupted), "answer": len(answer), "wrong_answer": len(wrong_answer)}
    if group is not None:
        sizes["group"] = len(group)
    off = {k: v for k, v in sizes.items() if v != n}
    if off:
        raise TaskValidationError(f"task {name!r}: {n} clean prompts but {off}; give one value per example")
    empty = [i for i in range(n) if len(clean[i]) == 0 or len(corrupted[i]) == 0]
    if empty:
        raise TaskValidationError(
            f"task {name!r}: rows {_rows_str(empty)} have an empty clean or corrupted prompt; drop or fill them"
        )
    unequal = [i for i in range(n) if len(clean[i]) != len(corrupted[i])]
    if unequal:
        detail = "; ".join(f"row {i}: clean {len(clean[i])} tokens, corrupted {len(corrupted[i])}"
                           for i in unequal[:_MAX_ROWS_SHOWN])
        raise TaskValidationError(
            f"task {name!r}: {len(unequal)} of {n} rows have clean and corrupted prompts of different "
            f"token lengths (rows {_rows_str(unequal)}; {detail}). Fix: make each corrupted prompt "
            "tokenize to as many tokens as its clean prompt (swap words that are single tokens in this "
            "tokenizer), or drop these rows"
        )
    c_ids, mask = _pad(clean, pad_id)
    x_ids, _ = _pad(corrupted, pad_id)
    return Task(name=name, clean=c_ids, corrupted=x_ids, attention_mask=mask,
                answer=torch.as_tensor(list(answer), dtype=torch.long),
                wrong_answer=torch.as_tensor(list(wrong_answer), dtype=torch.long),
                group=None if group is None else torch.as_tensor(list(group), dtype=torch.long), **kw)


def _single_token_ids(tokenizer, values: Sequence, column: str, task_name: str) -> list[int]:
    """Token ids of answer strings (each must be exactly one token) or integer ids as given."""
    ids, bad = [], []
    not_ids = [i for i, v in enumerate(values) if isinstance(v, (bool, np.bool_, float, np.floating))]
    if not_ids:
        raise TaskValidationError(
            f"task {task_name!r}: {column} in rows {_rows_str(not_ids)} is true/false or a decimal number; "
            "give each answer as a string (one token, e.g. \" Mary\") or as an integer token id")
    for i, v in enumerate(values):
        if isinstance(v, (int, np.integer)):
            ids.append(int(v))
            continue
        toks = tokenizer.encode(str(v))
        if len(toks) != 1:
            bad.append((i, v, toks))
            ids.append(-1)
        else:
            ids.append(toks[0])
    if bad:
        detail = "; ".join(
            f"row {i}: {v!r} -> {len(t)} tokens {[tokenizer.decode([x]) for x in t]}" for i, v, t in bad[:_MAX_ROWS_SHOWN]
        )
        hint = ""
        if any(isinstance(v, str) and not v.startswith(" ") and tokenizer.encode(" " + v).__len__() == 1
               for _, v, _ in bad):
            hint = " (a leading space often helps: ' Mary' is one GPT-2 token, 'Mary' may not be)"
        raise TaskValidationError(
            f"task {task_name!r}: {len(bad)} {column} values are not single tokens in tokenizer "
            f"{getattr(tokenizer, 'name', '?')!r} (rows {_rows_str([b[0] for b in bad])}; {detail}). "
            f"Fix: use answers that encode to exactly one token{hint}, or give token ids"
        )
    return ids


def task_from_texts(
    name: str,
    tokenizer,
    clean: Sequence[str],
    corrupted: Sequence[str],
    answer: Sequence,
    wrong_answer: Sequence,
    group: Sequence | None = None,
    prepend_bos: bool = True,
    **kw,
) -> Task:
    """Tokenize prompt pairs and answers (``prepend_bos`` adds the tokenizer's BOS, if it has one)
    and build a validated :class:`Task`."""
    if tokenizer is None:
        raise TaskValidationError(f"task {name!r} has text prompts: pass the model's tokenizer")
    n = len(clean)
    if n == 0:
        raise TaskValidationError(f"task {name!r} has no examples (empty data); provide at least one row")
    bos = [tokenizer.bos_id] if (prepend_bos and tokenizer.bos_id is not None) else []
    enc = getattr(tokenizer, "encode_batch", None) or (lambda xs: [tokenizer.encode(x) for x in xs])
    c_tok = [bos + ids for ids in enc([str(x) for x in clean])]
    x_tok = [bos + ids for ids in enc([str(x) for x in corrupted])]
    ans = _single_token_ids(tokenizer, answer, "answer", name)
    wrong = _single_token_ids(tokenizer, wrong_answer, "wrong_answer", name)
    grp = None
    if group is not None:
        grp = _group_codes(group)
        kw.setdefault("meta", {})
        kw["meta"] = {**kw["meta"], "group_labels": grp[1]}
        grp = grp[0]
    pad = getattr(tokenizer, "pad_id", None)
    pad = pad if pad is not None else (tokenizer.eos_id if tokenizer.eos_id is not None else 0)
    meta = {"tokenizer": getattr(tokenizer, "name", None),
            "tokenizer_hash": getattr(tokenizer, "content_hash", None), "prepend_bos": bool(bos)}
    kw["meta"] = {**meta, **kw.get("meta", {})}
    return task_from_token_lists(name, c_tok, x_tok, ans, wrong, grp, pad_id=pad,
                                 prompts=[str(x) for x in clean], corrupted_prompts=[str(x) for x in corrupted], **kw)


def _group_codes(group: Sequence) -> tuple[list[int], list]:
    """Integer codes for group labels (ints kept as they are)."""
    vals = list(group)
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in vals):
        return [int(v) for v in vals], sorted({int(v) for v in vals})
    labels = sorted({str(v) for v in vals})
    code = {lab: i for i, lab in enumerate(labels)}
    return [code[str(v)] for v in vals], labels


# --------------------------------------------------------------------------------------------
# Built-in tasks
# --------------------------------------------------------------------------------------------


def _rng(seed: int, salt: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), salt]))


def induction_task(
    tokenizer=None,
    n: int = 100,
    seed: int = 0,
    seq_len: int = 20,
    vocab_size: int | None = None,
    token_ids: Sequence[int] | None = None,
    corrupt: str = "all",
    prepend_bos: bool = True,
    bos_id: int | None = None,
    metric: str | Callable = "logit_diff",
    metric_kwargs: dict | None = None,
) -> Task:
    """Repeated random tokens: ``[BOS] A A[:-1]`` -> answer ``A[-1]`` (A: ``seq_len`` distinct tokens).

    Corruption changes the first occurrence: ``corrupt="all"`` (default) replaces the whole first
    copy by other random tokens A' (wrong answer ``A'[-1]``, what copying position-wise would
    give); ``corrupt="answer"`` replaces only the answer token's first occurrence by a new token w
    (wrong answer w: the token an induction head would copy in the corrupted run).
    Works for any vocabulary: pass a tokenizer, or ``vocab_size`` (all ids), or ``token_ids``.
    """
    if corrupt not in ("all", "answer"):
        raise TaskValidationError(f"induction: corrupt must be 'all' or 'answer', got {corrupt!r}")
    n = check_int("induction: n", n, minimum=1)
    seq_len = check_int("induction: seq_len", seq_len, minimum=2)
    prepend_bos = _check_bool("induction: prepend_bos", prepend_bos)
    if vocab_size is not None:
        vocab_size = check_int("induction: vocab_size", vocab_size, minimum=2)
    if bos_id is not None:
        bos_id = check_int("induction: bos_id", bos_id, minimum=0)
    special: set[int] = set()
    if tokenizer is not None:
        vocab_size = vocab_size or tokenizer.vocab_size
        special = {i for i in (tokenizer.bos_id, tokenizer.eos_id, getattr(tokenizer, "pad_id", None)) if i is not None}
        if bos_id is None:
            bos_id = tokenizer.bos_id
    if token_ids is not None:
        pool = np.unique(np.asarray(check_token_ids("induction: token_ids", token_ids), dtype=np.int64))
    elif vocab_size is not None:
        pool = np.setdiff1d(np.arange(int(vocab_size), dtype=np.int64), np.asarray(sorted(special), dtype=np.int64))
    else:
        raise TaskValidationError("induction: pass a tokenizer, vocab_size or token_ids")
    need = 2 * seq_len if corrupt == "all" else seq_len + 1
    if len(pool) < need:
        raise TaskValidationError(
            f"induction: {len(pool)} candidate tokens are too few for seq_len={seq_len} (need {need}); "
            "lower seq_len or widen the vocabulary"
        )
    rng = _rng(seed, 0x1D0C)
    bos = [int(bos_id)] if (prepend_bos and bos_id is not None) else []
    clean, corr, ans, wrong = [], [], [], []
    for _ in range(n):
        draw = rng.choice(len(pool), size=need, replace=False)
        a = pool[draw[:seq_len]].tolist()
        if corrupt == "all":
            a2 = pool[draw[seq_len:]].tolist()
        else:
            a2 = a[:-1] + [int(pool[draw[seq_len]])]
        clean.append(bos + a + a[:-1])
        corr.append(bos + a2 + a[:-1])
        ans.append(a[-1])
        wrong.append(a2[-1])
    meta = {"seq_len": seq_len, "corrupt": corrupt, "seed": seed, "pool_size": int(len(pool)),
            "token_pool": pool.tolist(),
            "prepend_bos": bool(bos), "first_repeat": [len(bos), len(bos) + seq_len]}
    return task_from_token_lists("induction", clean, corr, ans, wrong, pad_id=0, metric=metric,
                                 metric_kwargs=dict(metric_kwargs or {}), meta=meta)


# Wang et al. (2022) style templates; [A] = indirect object (answer), [B] = subject (wrong answer).
IOI_TEMPLATES: tuple[str, ...] = (
    "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to",
    "Then, [B] and [A] had a lot of fun at the [PLACE]. [B] gave a [OBJECT] to",
    "Then, [B] and [A] were working at the [PLACE]. [B] decided to give a [OBJECT] to",
    "Then, [B] and [A] were thinking about going to the [PLACE]. [B] wanted to give a [OBJECT] to",
    "Then, [B] and [A] had a long argument, and afterwards [B] said to",
    "After [B] and [A] went to the [PLACE], [B] gave a [OBJECT] to",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give it to",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give the [OBJECT] to",
    "While [B] and [A] were working at the [PLACE], [B] gave a [OBJECT] to",
    "While [B] and [A] were commuting to the [PLACE], [B] gave a [OBJECT] to",
    "After the lunch, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to",
    "Afterwards, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to",
    "Then, [B] and [A] had a long argument. Afterwards [B] said to",
    "The [PLACE] [B] and [A] went to had a [OBJECT]. [B] gave it to",
    "Friends [B] and [A] found a [OBJECT] at the [PLACE]. [B] gave it to",
)
IOI_NAMES: tuple[str, ...] = (
    "Michael", "Christopher", "Jessica", "Matthew", "Ashley", "Jennifer", "Joshua", "Amanda", "Daniel",
    "David", "James", "Robert", "John", "Joseph", "Andrew", "Ryan", "Brandon", "Jason", "Justin", "Sarah",
    "William", "Jonathan", "Stephanie", "Brian", "Nicole", "Nicholas", "Anthony", "Heather", "Eric",
    "Elizabeth", "Adam", "Megan", "Melissa", "Kevin", "Steven", "Thomas", "Timothy", "Christina", "Kyle",
    "Rachel", "Laura", "Lauren", "Amber", "Brittany", "Danielle", "Richard", "Kimberly", "Jeffrey", "Amy",
    "Crystal", "Michelle", "Tiffany", "Jeremy", "Benjamin", "Mark", "Emily", "Aaron", "Charles", "Rebecca",
    "Jacob", "Stephen", "Patrick", "Sean", "Erin", "Zachary", "Jamie", "Kelly", "Samantha", "Nathan",
    "Sara", "Dustin", "Paul", "Angela", "Tyler", "Scott", "Katherine", "Andrea", "Gregory", "Erica",
    "Mary", "Travis", "Lisa", "Kenneth", "Bryan", "Lindsey", "Kristen", "Jose", "Alexander", "Jesse",
    "Katie", "Lindsay", "Shannon", "Vanessa", "Courtney", "Christine", "Alicia", "Cody", "Allison",
    "Bradley", "Samuel",
)
IOI_PLACES = ("store", "garden", "restaurant", "school", "hospital", "office", "house", "station")
IOI_OBJECTS = ("ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack")
_MIN_IOI_NAMES = 5


def _fill(template: str, names: dict[str, list[str]], place: str, obj: str) -> str:
    """Replace placeholders; ``names[key]`` lists successive fillers for repeated placeholders."""
    out = template.replace("[PLACE]", place).replace("[OBJECT]", obj)
    for key, fillers in names.items():
        for f in fillers:
            out = out.replace(f"[{key}]", f, 1)
        out = out.replace(f"[{key}]", fillers[-1])
    return out


def ioi_task(
    tokenizer,
    n: int = 100,
    seed: int = 0,
    templates: Sequence[str] | None = None,
    names: Sequence[str] | None = None,
    places: Sequence[str] = IOI_PLACES,
    objects: Sequence[str] = IOI_OBJECTS,
    corrupt: str = "abc",
    prepend_bos: bool = True,
    metric: str | Callable = "logit_diff",
    metric_kwargs: dict | None = None,
) -> Task:
    """Indirect-object identification (Wang et al. 2022): "When Mary and John went to the store,
    John gave a drink to" -> " Mary" (answer = indirect object, wrong answer = subject).

    Half of the examples use the ABBA order, half BABA. ``corrupt="abc"`` replaces the three name
    slots (IO, S1, S2) by three other distinct names; ``corrupt="abb"`` replaces IO and both
    subject mentions by two new names, keeping the repetition. Names are those of ``names`` that
    are single tokens (with a leading space) in the tokenizer; group = template id.
    """
    if tokenizer is None:
        raise TaskValidationError("ioi: pass the model's tokenizer")
    if corrupt not in ("abc", "abb"):
        raise TaskValidationError(f"ioi: corrupt must be 'abc' or 'abb', got {corrupt!r}")
    templates = list(templates or IOI_TEMPLATES)
    for t in templates:
        if "[A]" not in t or "[B]" not in t or t.count("[B]") < 2:
            raise TaskValidationError(f"ioi template {t!r} needs one [A] and two [B] placeholders")
    candidates = list(names or IOI_NAMES)
    single = [nm for nm in candidates if len(tokenizer.encode(" " + nm)) == 1]
    if len(single) < _MIN_IOI_NAMES:
        raise TaskValidationError(
            f"ioi: only {len(single)} of {len(candidates)} names are single tokens (with a leading space) in "
            f"tokenizer {getattr(tokenizer, 'name', '?')!r}: {single}; IOI needs at least {_MIN_IOI_NAMES}. "
            "Pass names=[...] that are single tokens, or use a tokenizer trained on English text (e.g. 'gpt2')"
        )
    rng = _rng(seed, 0x101)
    clean, corr, ans, wrong, grp = [], [], [], [], []
    for i in range(n):
        ti = int(rng.integers(len(templates)))
        t = templates[ti]
        if i % 2 == 1:  # ABBA: IO first
            t = t.replace("[B] and [A]", "[A] and [B]", 1)
        pick = rng.choice(len(single), size=5, replace=False)
        a, b, x, y, z = (" " + single[j] for j in pick)
        place = places[int(rng.integers(len(places)))]
        obj = objects[int(rng.integers(len(objects)))]
        text = _fill(t, {"A": [a.strip()], "B": [b.strip()]}, place, obj)
        if corrupt == "abc":
            ctext = _fill(t, {"A": [x.strip()], "B": [y.strip(), z.strip()]}, place, obj)
        else:
            ctext = _fill(t, {"A": [x.strip()], "B": [y.strip()]}, place, obj)
        clean.append(text)
        corr.append(ctext)
        ans.append(a)
        wrong.append(b)
        grp.append(ti)
    task = task_from_texts("ioi", tokenizer, clean, corr, ans, wrong, group=grp, prepend_bos=prepend_bos,
                           metric=metric, metric_kwargs=dict(metric_kwargs or {}),
                           meta={"seed": seed, "corrupt": corrupt, "n_names": len(single),
                                 "templates": templates})
    return task


GT_NOUNS = ("war", "expedition", "siege", "drought", "famine", "pandemic", "reign", "voyage",
            "journey", "blockade", "strike", "rebellion")


def greater_than_task(
    tokenizer,
    n: int = 100,
    seed: int = 0,
    nouns: Sequence[str] = GT_NOUNS,
    template: str = "The {noun} lasted from 17{yy} to 17",
    century: str = "17",
    corrupt_yy: str = "01",
    prepend_bos: bool = True,
    metric: str | Callable = "prob_diff",
    metric_kwargs: dict | None = None,
) -> Task:
    """Greater-than (Hanna et al. 2023): "The war lasted from 1732 to 17" -> a year above 32.

    YY is drawn from the years 02..98 whose "17YY" tokenizes as ["17", "YY"]; the corrupted prompt
    uses YY = ``corrupt_yy``. Metric: probability difference over the two-digit year tokens,
    sum p(YY' > YY) - sum p(YY' <= YY). answer = YY+1, wrong answer = YY (for logit-difference
    use). group = noun id. Needs all "00".."99" to be single tokens (true for GPT-2).
    """
    if tokenizer is None:
        raise TaskValidationError("greater-than: pass the model's tokenizer")
    years = [tokenizer.encode(f"{k:02d}") for k in range(100)]
    not_single = [f"{k:02d}" for k, ids in enumerate(years) if len(ids) != 1]
    if not_single:
        raise TaskValidationError(
            f"greater-than: {len(not_single)} of the two-digit numbers are not single tokens in tokenizer "
            f"{getattr(tokenizer, 'name', '?')!r} (e.g. {not_single[:5]}); the task needs a GPT-2-like "
            "tokenizer (use 'gpt2')"
        )
    year_ids = [ids[0] for ids in years]

    valid = [(noun, yy) for noun in nouns for yy in range(2, 99)
             if _gt_split(tokenizer, template, noun, f"{yy:02d}", year_ids, century)]
    bad_nouns = [noun for noun in nouns if not _gt_split(tokenizer, template, noun, corrupt_yy, year_ids, century)]
    if bad_nouns or not valid:
        raise TaskValidationError(
            f"greater-than: in tokenizer {getattr(tokenizer, 'name', '?')!r} the template {template!r} does not "
            f"split '{century}YY' into ['{century}', 'YY'] for nouns {bad_nouns or list(nouns)}; "
            "change the template or the nouns"
        )
    rng = _rng(seed, 0x67)
    pick = rng.choice(len(valid), size=n, replace=len(valid) < n)
    clean, corr, ans, wrong, grp, yys = [], [], [], [], [], []
    for j in pick:
        noun, yy = valid[int(j)]
        clean.append(template.format(noun=noun, yy=f"{yy:02d}"))
        corr.append(template.format(noun=noun, yy=corrupt_yy))
        ans.append(year_ids[yy + 1])
        wrong.append(year_ids[yy])
        grp.append(list(nouns).index(noun))
        yys.append(yy)
    ks = torch.arange(100).unsqueeze(0)
    thr = torch.as_tensor(yys).unsqueeze(1)
    return task_from_texts(
        "greater-than", tokenizer, clean, corr, ans, wrong, group=grp, prepend_bos=prepend_bos,
        metric=metric, metric_kwargs=dict(metric_kwargs or {}),
        candidates=torch.as_tensor(year_ids), good=ks > thr, bad=ks <= thr,
        meta={"seed": seed, "template": template, "corrupt_yy": corrupt_yy, "years": yys},
    )


def _gt_split(tokenizer, template: str, noun: str, yy: str, year_ids: list[int], century: str = "17") -> bool:
    """True if the prompt ends in [..., century, YY, ..., century] with YY one token."""
    text = template.format(noun=noun, yy=yy)
    head = text.split(century + yy, 1)[0]
    ids = tokenizer.encode(text)
    head_ids = tokenizer.encode(head + century)
    if len(head_ids) < 1 or ids[: len(head_ids)] != head_ids:
        return False
    return len(ids) > len(head_ids) and ids[len(head_ids)] == year_ids[int(yy)] and \
        tokenizer.decode(ids[-1:]).strip() == century


# --------------------------------------------------------------------------------------------
# File task
# --------------------------------------------------------------------------------------------

FILE_COLUMNS = ("clean", "corrupted", "answer", "wrong_answer")


def _read_frame(path: Path):
    import pandas as pd

    suffix = path.suffix.lower()
    try:
        if suffix in (".jsonl", ".ndjson"):
            return pd.read_json(path, lines=True, dtype=False)
        if suffix == ".json":
            try:
                return pd.read_json(path, dtype=False)
            except ValueError:
                return pd.read_json(path, lines=True, dtype=False)
        if suffix in (".csv", ".tsv"):
            return pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",", dtype=str,
                               keep_default_na=False, na_values=[""])
        if suffix == ".parquet":
            return pd.read_parquet(path)
    except ValueError as e:
        if "Expected object or value" in str(e) or path.stat().st_size == 0:
            return pd.DataFrame()
        raise TaskValidationError(f"{path}: could not read it as {suffix[1:]}: {e}") from e
    except Exception as e:  # pandas raises EmptyDataError for empty CSV
        if path.exists() and path.stat().st_size == 0 or type(e).__name__ == "EmptyDataError":
            return pd.DataFrame()
        raise TaskValidationError(f"{path}: could not read it as {suffix[1:]}: {e}") from e
    raise TaskValidationError(f"{path}: unknown task file type {suffix!r}; use .jsonl, .csv or .parquet")


def file_task(
    path: str | os.PathLike,
    tokenizer,
    n: int | None = None,
    seed: int = 0,
    prepend_bos: bool = True,
    metric: str | Callable = "logit_diff",
    name: str | None = None,
    metric_kwargs: dict | None = None,
) -> Task:
    """A user task from JSONL, CSV or Parquet with columns ``clean, corrupted, answer, wrong_answer``
    (and optional ``group``). Answers are strings (each one token, e.g. " Mary") or integer ids.
    ``n`` keeps the first n rows."""
    p = Path(path).expanduser()
    if not p.exists():
        raise TaskValidationError(f"task file {p} does not exist")
    df = _read_frame(p)
    task_name = name or p.stem
    missing = [c for c in FILE_COLUMNS if c not in df.columns]
    if missing:
        raise TaskValidationError(
            f"task file {p}: missing column(s) {missing} (found {list(df.columns)}); a task file needs "
            f"columns {list(FILE_COLUMNS)} and optionally 'group'"
        )
    if len(df) == 0:
        raise TaskValidationError(f"task file {p} has no rows (empty data); add examples")
    if n is not None:
        df = df.iloc[: int(n)]
    cols = list(FILE_COLUMNS) + (["group"] if "group" in df.columns else [])
    null_rows = sorted({int(i) for c in cols for i in np.flatnonzero(df[c].isna().to_numpy())})
    if null_rows:
        raise TaskValidationError(
            f"task file {p}: rows {_rows_str(null_rows)} have empty values in {cols}; fill or drop them"
        )
    empty = sorted(int(i) for c in ("clean", "corrupted")
                   for i in np.flatnonzero(df[c].astype(str).str.len().to_numpy() == 0))
    if empty:
        raise TaskValidationError(f"task file {p}: rows {_rows_str(empty)} have an empty prompt; fill or drop them")

    def col(c):
        vals = df[c].tolist()
        return [v.item() if isinstance(v, np.generic) else v for v in vals]

    return task_from_texts(
        task_name, tokenizer, col("clean"), col("corrupted"), col("answer"), col("wrong_answer"),
        group=col("group") if "group" in df.columns else None, prepend_bos=prepend_bos,
        metric=metric, metric_kwargs=dict(metric_kwargs or {}), meta={"source": str(p)},
    )


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

TASKS: dict[str, Callable[..., Task]] = {}


def register_task(name: str, *aliases: str):
    """Decorator: make a task builder ``fn(tokenizer, n, seed, **kw) -> Task`` available to make_task."""
    def deco(fn):
        for k in (name, *aliases):
            TASKS[k] = fn
        return fn
    return deco


register_task("induction")(induction_task)
register_task("ioi")(ioi_task)
register_task("greater-than", "greater_than", "gt")(greater_than_task)


def _file_builder(tokenizer=None, n=None, seed=0, path=None, prepend_bos: bool = True,
                  metric: "str | Callable" = "logit_diff", name: str | None = None,
                  metric_kwargs: dict | None = None) -> Task:
    if path is None:
        raise TaskValidationError("the file task needs path=... (a .jsonl, .csv or .parquet file)")
    return file_task(path, tokenizer, n=n, seed=seed, prepend_bos=prepend_bos, metric=metric, name=name,
                     metric_kwargs=metric_kwargs)


register_task("file")(_file_builder)
_FILE_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet")


def make_task(name: str, tokenizer=None, n: int | None = None, seed: int = 0, **kw) -> Task:
    """Build a task by name: ``induction``, ``ioi``, ``greater-than``, ``file`` (``path=...``), a
    registered custom name, or a path to a task file. ``tokenizer`` may be a tokenizer or anything
    :func:`circuits.tokenizers.load_tokenizer` accepts (e.g. ``"gpt2"``)."""
    from circuits.tokenizers import load_tokenizer

    if tokenizer is not None and isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(tokenizer)
    key = str(name)
    if n is not None:
        n = check_int(f"task {key!r}: n", n, minimum=1)
    seed = check_int(f"task {key!r}: seed", seed, minimum=0)
    if key.lower().endswith(_FILE_SUFFIXES) and key not in TASKS:
        _check_options(file_task, kw, key, exclude=("path",))
        return file_task(key, tokenizer, n=n, seed=seed, **kw)
    builder = TASKS.get(key) or TASKS.get(key.lower().replace("_", "-")) or TASKS.get(key.lower())
    if builder is None:
        raise TaskValidationError(
            f"unknown task {name!r}; choose one of {sorted(set(TASKS))} or give a .jsonl/.csv/.parquet file"
        )
    _check_options(builder, kw, key)
    if n is None and key != "file":
        n = 100
    return builder(tokenizer=tokenizer, n=n, seed=seed, **kw)


def task_options(builder: Callable, exclude: Sequence[str] = ()) -> list[str] | None:
    """The option names a task builder accepts besides tokenizer, n, seed and ``exclude`` (None: any, ``**kw``)."""
    import inspect

    params = inspect.signature(builder).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return None
    return sorted(k for k in params if k not in {"tokenizer", "n", "seed", *exclude})


def _check_options(builder: Callable, kw: dict, name: str, exclude: Sequence[str] = ()) -> None:
    """TaskValidationError naming options ``builder`` does not take (never swallowed as metric options)."""
    allowed = task_options(builder, exclude)
    unknown = [] if allowed is None else sorted(set(kw) - set(allowed))
    if unknown:
        raise TaskValidationError(f"task {name!r}: unknown option(s) {', '.join(map(repr, unknown))}; "
                                  f"the options are {', '.join(allowed)}")
