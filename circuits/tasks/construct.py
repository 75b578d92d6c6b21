"""Building a Task from per-example token lists or texts (tokenizing, padding and validating)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .task import Task
from .validation import MAX_ROWS_SHOWN, TaskValidationError, rows_str


def _pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    p = max(len(r) for r in rows)
    ids = torch.full((len(rows), p), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), p), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def _length_problem(clean: Sequence[Sequence[int]], corrupted: Sequence[Sequence[int]]) -> str | None:
    """The rows whose clean and corrupted prompts differ in token length, with the fix; None when none do."""
    n = len(clean)
    unequal = [i for i in range(n) if len(clean[i]) != len(corrupted[i])]
    if not unequal:
        return None
    detail = "; ".join(f"row {i + 1}: clean {len(clean[i])} tokens, corrupted {len(corrupted[i])}"
                       for i in unequal[:MAX_ROWS_SHOWN])
    return (f"{len(unequal)} of {n} rows have clean and corrupted prompts of different "
            f"token lengths (rows {rows_str(unequal)}; {detail}). Fix: make each corrupted prompt "
            "tokenize to as many tokens as its clean prompt (swap words that are single tokens in this "
            "tokenizer), or drop these rows")


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
            f"task {name!r}: rows {rows_str(empty)} have an empty clean or corrupted prompt; drop or fill them"
        )
    _raise_problems(name, [_length_problem(clean, corrupted)])
    c_ids, mask = _pad(clean, pad_id)
    x_ids, _ = _pad(corrupted, pad_id)
    return Task(name=name, clean=c_ids, corrupted=x_ids, attention_mask=mask,
                answer=torch.as_tensor(list(answer), dtype=torch.long),
                wrong_answer=torch.as_tensor(list(wrong_answer), dtype=torch.long),
                group=None if group is None else torch.as_tensor(list(group), dtype=torch.long), **kw)


def _answer_ids(tokenizer, values: Sequence, column: str) -> tuple[list[int], str | None]:
    """(token ids of answer strings, each meant to be one token, or integer ids as given; the problem with
    ``column``'s values, naming every bad row, or None)."""
    not_ids = [i for i, v in enumerate(values) if isinstance(v, (bool, np.bool_, float, np.floating))]
    if not_ids:
        return [], (f"{column} in rows {rows_str(not_ids)} is true/false or a decimal number; give each answer "
                    "as a string (one token, e.g. \" Mary\") or as an integer token id")
    ids, bad = [], []
    for i, v in enumerate(values):
        if isinstance(v, (int, np.integer)):
            ids.append(int(v))
            continue
        toks = tokenizer.encode(str(v))
        if len(toks) != 1:
            bad.append((i, v, toks))
        ids.append(toks[0] if len(toks) == 1 else -1)
    if not bad:
        return ids, None
    detail = "; ".join(
        f"row {i + 1}: {v!r} -> {len(t)} tokens {[tokenizer.decode([x]) for x in t]}" for i, v, t in bad[:MAX_ROWS_SHOWN]
    )
    hint = ""
    if any(isinstance(v, str) and not v.startswith(" ") and len(tokenizer.encode(" " + v)) == 1 for _, v, _ in bad):
        hint = " (a leading space often helps: ' Mary' is one GPT-2 token, 'Mary' may not be)"
    return ids, (f"{len(bad)} {column} values are not single tokens in tokenizer "
                 f"{getattr(tokenizer, 'name', '?')!r} (rows {rows_str([b[0] for b in bad])}; {detail}). "
                 f"Fix: use answers that encode to exactly one token{hint}, or give token ids")


def _single_token_ids(tokenizer, values: Sequence, column: str, task_name: str) -> list[int]:
    """Token ids of answer strings (each must be exactly one token) or integer ids as given."""
    ids, problem = _answer_ids(tokenizer, values, column)
    if problem:
        raise TaskValidationError(f"task {task_name!r}: {problem}")
    return ids


def _raise_problems(name: str, problems: Sequence[str]) -> None:
    """None when ``problems`` is empty; else one TaskValidationError naming all of them (each row and column)."""
    problems = [p for p in problems if p]
    if len(problems) == 1:
        raise TaskValidationError(f"task {name!r}: {problems[0]}")
    if problems:
        raise TaskValidationError(f"task {name!r} has {len(problems)} problems: "
                                  + " | ".join(f"({i}) {p}" for i, p in enumerate(problems, 1)))


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
    ans, ans_problem = _answer_ids(tokenizer, answer, "answer")
    wrong, wrong_problem = _answer_ids(tokenizer, wrong_answer, "wrong_answer")
    # every problem of every column at once: a user fixes a file in one pass, not one error per run
    _raise_problems(name, [ans_problem, wrong_problem, _length_problem(c_tok, x_tok)])
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



def task_rng(seed: int, salt: int) -> np.random.Generator:
    """The generator a built-in task draws from: ``seed`` mixed with the task's own ``salt``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), salt]))

