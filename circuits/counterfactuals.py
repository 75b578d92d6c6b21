"""Counterfactual draws of a task: other corrupted prompts for the same clean prompts.

Draw 0 is the task's own corrupted prompts. For induction the others re-draw the corrupted tokens
of the same clean prompts (``redraw``); for other tasks each clean prompt takes the corrupted prompt
of another example of the same length and group (``shuffle``). The metric (answer vs the task's
wrong answer) is held fixed, so only the patched-in activations change; :func:`with_counterfactual`
makes a draw the task's corrupted input. The randomness of each draw is its seed, given by the
caller (the variance study spawns one per draw from its stage seed).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from circuitstat.core.errors import InputError

__all__ = ["with_counterfactual", "counterfactual_corruptions"]


def with_counterfactual(task, corrupted):
    """A copy of ``task`` whose corrupted prompts are ``corrupted`` [N, P]; everything else (clean
    prompts, answers, the metric's wrong answer) is unchanged.

    The copy goes through attribution with the ordinary 'counterfactual' ablation, so every
    estimator sees this draw as *the* corrupted input: clean-corrupted takes its second gradient
    on the corrupted run itself. (An ablation object would give the same exact and EAP scores, but
    clean-corrupted would then take that gradient at the all-edges-patched point, where only the
    logits receiver has a nonzero gradient.)
    """
    import dataclasses

    import torch

    ids = torch.as_tensor(np.asarray(corrupted), dtype=torch.long)
    if ids.shape != task.clean.shape:
        raise InputError(f"counterfactual draw has shape {tuple(ids.shape)}, the task {tuple(task.clean.shape)}")
    return dataclasses.replace(task, corrupted=ids, corrupted_prompts=None,
                               meta={**task.meta, "counterfactual_draw": True})


def _redraw(task, rng: np.random.Generator, pool: np.ndarray):
    """Induction: new random tokens in the corrupted span of every prompt, clean prompts unchanged."""
    meta = task.meta
    s0, s1 = (int(x) for x in meta["first_repeat"])
    span = np.arange(s0, s1) if meta.get("corrupt", "all") == "all" else np.array([s1 - 1])
    clean = task.clean.numpy()
    new = task.corrupted.numpy().copy()
    for n in range(clean.shape[0]):
        cand = np.setdiff1d(pool, clean[n, s0:s1])  # as the task: corrupted tokens avoid A
        if cand.size < span.size:
            raise InputError(f"induction: {cand.size} tokens are too few to redraw {span.size} corrupted positions; "
                             "use counterfactual.scheme 'shuffle' or a larger vocabulary")
        new[n, span] = rng.choice(cand, size=span.size, replace=False)
    return new


def _shuffle(task, rng: np.random.Generator):
    """Each clean prompt takes the corrupted prompt of another example with its length (and group)."""
    from .ablation import derangement

    lengths = task.attention_mask.sum(-1).numpy()
    groups = np.zeros_like(lengths) if task.group is None else task.group.numpy()
    new = task.corrupted.numpy().copy()
    src = task.corrupted.numpy()
    keys = np.stack([lengths, groups], 1)
    for key in np.unique(keys, axis=0):
        rows = np.flatnonzero((keys == key).all(1))
        if rows.size < 2:
            raise InputError(f"counterfactual shuffle: example {int(rows[0])} has no other example of its length "
                             f"{int(key[0])}{'' if task.group is None else ' and group'}; use more examples, "
                             "counterfactual.n_draws 1, or a task with equal-length prompts")
        perm = derangement(rows.size, int(rng.integers(2**31)))
        new[rows] = src[rows[perm]]
    return new


def counterfactual_corruptions(task, scheme: str, draw_seeds: Sequence[Any], pool) -> list[np.ndarray]:
    """Return corrupted-id arrays [N, P]: the task's own corrupted prompts, then one draw per seed.

    ``scheme``: 'redraw', 'shuffle' or 'auto' (redraw for the induction task, shuffle otherwise).
    ``draw_seeds``: the seed (a ``numpy.random.SeedSequence`` or an int) of draws 1, 2, ...
    ``pool``: the token ids a redraw may use (the induction task's candidates: the vocabulary
    without special tokens, or its ``token_ids``).
    """
    pool = np.unique(np.asarray(pool, dtype=np.int64))

    if scheme == "auto":
        scheme = "redraw" if task.name == "induction" and "first_repeat" in task.meta else "shuffle"
    if scheme == "redraw" and not (task.name == "induction" and "first_repeat" in task.meta):
        raise InputError(f"counterfactual.scheme 'redraw' needs the induction task (got {task.name!r}); use 'shuffle'")
    out = [task.corrupted.numpy()]
    for ss in draw_seeds:
        rng = np.random.default_rng(ss)
        out.append(_redraw(task, rng, pool) if scheme == "redraw" else _shuffle(task, rng))
    return out
