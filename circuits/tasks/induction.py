"""The induction task: repeated random tokens, for any vocabulary."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .construct import task_from_token_lists, task_rng
from .task import Task
from .validation import TaskValidationError, check_bool, check_int, check_token_ids


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
    prepend_bos = check_bool("induction: prepend_bos", prepend_bos)
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
    rng = task_rng(seed, 0x1D0C)
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

