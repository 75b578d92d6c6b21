"""Model read-outs on a fixed probe set: attention patterns, residual rows, head importance.

These are the torch-side inputs of head-stability analysis (``circuitstat.pipelines.runs.heads.stability``); the
statistics computed from them live in ``circuitstat.stats.head_stability`` and ``circuitstat.stats.similarity``.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import torch

from circuitstat.core.params import BATCH_SIZE

__all__ = ["HOOKS", "attention_patterns", "cka_positions", "residual_rows", "prompt_losses", "head_importance"]

#: residual-stream read-out points: ``pre`` = input of a layer, ``post`` = after its attention
HOOKS = ("pre", "post")


def _batches(n: int, batch_size: int) -> Iterator[slice]:
    for start in range(0, n, batch_size):
        yield slice(start, min(n, start + batch_size))


def attention_patterns(model, ids: np.ndarray, batch_size: int = BATCH_SIZE.default_for("heads")) -> np.ndarray:
    """Return attention probabilities ``[L, H, N, T, T]`` (float32) of every head on every prompt."""
    out = []
    with torch.no_grad():
        for rows in _batches(ids.shape[0], batch_size):
            run = model.run(torch.tensor(ids[rows], device=model.device), keep_patterns=True, compute_logits=False)
            out.append(np.stack([p.float().cpu().numpy() for p in run.patterns]))  # [L, B, H, T, T]
    return np.concatenate(out, axis=1).transpose(0, 2, 1, 3, 4).astype(np.float32, copy=False)


def cka_positions(length: int, n_tokens: int) -> np.ndarray:
    """Return the token positions used as CKA rows: ``n_tokens`` evenly spaced, never the first."""
    n_tokens = max(1, min(int(n_tokens), length - 1))
    return np.unique(np.linspace(1, length - 1, n_tokens).round().astype(np.int64))


def residual_rows(model, ids: np.ndarray, positions: np.ndarray, hooks: Sequence[str] = HOOKS,
                  batch_size: int = BATCH_SIZE.default_for("heads")) -> dict[str, np.ndarray]:
    """Return the residual stream ``{hook: [L, N * len(positions), D]}`` (float64), rows prompt-major.

    ``pre``: the input of layer l (before attention); ``post``: after layer l's attention.
    """
    collected: dict[str, list] = {hook: [] for hook in hooks}
    with torch.no_grad():
        for rows in _batches(ids.shape[0], batch_size):
            run = model.run(torch.tensor(ids[rows], device=model.device), keep_resid=True, compute_logits=False)
            for hook in hooks:
                stream = run.resid_pre if hook == "pre" else run.resid_mid
                collected[hook].append(np.stack([t[:, positions].double().cpu().numpy() for t in stream]))
    out = {}
    for hook in hooks:
        stacked = np.concatenate(collected[hook], axis=1)  # [L, N, r, D]
        out[hook] = stacked.reshape(stacked.shape[0], -1, stacked.shape[-1])
    return out


def prompt_losses(model, tokens: torch.Tensor, intervention=None) -> np.ndarray:
    """Return the mean next-token cross-entropy of each prompt ``[B]`` (float64)."""
    import torch.nn.functional as F

    logits = model.run(tokens, intervention=intervention).logits
    if logits.dtype != torch.float64:
        logits = logits.float()
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="none")
    return nll.view(tokens.shape[0], -1).mean(1).double().cpu().numpy()


def head_importance(model, ids: np.ndarray, batch_size: int = BATCH_SIZE.default_for("heads")) -> tuple[np.ndarray, np.ndarray]:
    """Return per-prompt mean next-token loss: clean ``[N]`` and with each head zero-ablated ``[L, H, N]``.

    Zero ablation replaces the head's output (its pattern-weighted values times W_O) by zeros in
    the residual stream; the layer's output bias b_O is kept.
    """
    from circuitstat.circuits.interventions import Intervention

    cfg, graph = model.cfg, model.graph
    n_prompts = ids.shape[0]
    clean = np.zeros(n_prompts)
    ablated = np.zeros((cfg.n_layers, cfg.n_heads, n_prompts))
    zeros = torch.zeros(1, graph.n_senders, 1, cfg.d_model, dtype=model.dtype, device=model.device)
    with torch.no_grad():
        for rows in _batches(n_prompts, batch_size):
            tokens = torch.tensor(ids[rows], device=model.device)
            clean[rows] = prompt_losses(model, tokens)
            for layer in range(cfg.n_layers):
                for head in range(cfg.n_heads):
                    mask = torch.zeros(graph.n_senders, dtype=torch.bool, device=model.device)
                    mask[graph.head_sender(layer, head)] = True
                    ablated[layer, head, rows] = prompt_losses(model, tokens, Intervention.nodes(mask, zeros))
    return clean, ablated
