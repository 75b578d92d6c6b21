"""The Task object: clean/corrupted prompt pairs with answers and a metric, checked on construction."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import numpy as np
import torch

from circuitstat.circuits.metrics import Metric, get_metric

from .validation import TaskValidationError, rows_str


@dataclass(eq=False)
class Task:
    """N clean/corrupted prompt pairs with answers, a metric and optional groups (see :mod:`circuitstat.circuits.tasks`)."""

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
            raise TaskValidationError(f"task {self.name!r}: rows {rows_str(empty)} have no tokens; drop them")
        ar = torch.arange(m.shape[1]).unsqueeze(0)
        not_right = torch.nonzero(((ar < lengths.unsqueeze(1)).long() != m).any(1)).flatten().tolist()
        if not_right:
            raise TaskValidationError(
                f"task {self.name!r}: rows {rows_str(not_right)} are not right-padded (mask must be "
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
                raise TaskValidationError(f"task {self.name!r}: {nm} is negative in rows {rows_str(neg)}")

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
                        f"task {self.name!r}: {nm} prompts in rows {rows_str(bad)} contain token ids "
                        f">= the model's vocabulary size {vocab_size}; build the task with the model's tokenizer"
                    )
            for nm, t in (("answer", self.answer), ("wrong_answer", self.wrong_answer)):
                bad = torch.nonzero(t >= vocab_size).flatten().tolist()
                if bad:
                    raise TaskValidationError(
                        f"task {self.name!r}: {nm} ids in rows {rows_str(bad)} are >= the vocabulary "
                        f"size {vocab_size}; build the task with the model's tokenizer"
                    )
        if n_ctx is not None and self.n_positions > n_ctx:
            long_rows = torch.nonzero(self.lengths > n_ctx).flatten().tolist()
            raise TaskValidationError(
                f"task {self.name!r}: rows {rows_str(long_rows)} are longer than the model's context "
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
