"""Counterfactual sender outputs for each ablation: what a patched edge or node carries instead.

* ``counterfactual``: the paired corrupted input's sender outputs (activation patching).
* ``zero``: zeros.
* ``mean``: each sender's mean output over a named reference dataset, averaged over examples and
  real token positions, per sender (EAP-IG's non-positional mean also averages across nodes; we
  do not).
* ``mean-positional``: the same, per position (reference prompts must be at least as long).
* ``resample``: the clean run of another example, drawn once per dataset from the run's seed
  (a derangement, so no example is its own counterfactual and results do not depend on batching).

What the ``input`` sender is (``input_node``):

* ``"embeddings"`` (default): token plus learned position embeddings, the whole residual stream
  entering layer 0.  Zero/mean ablation of the input replaces both.
* ``"tokens"``: the token embedding only, the convention of the EAP-IG library and the MIB
  benchmark; the position embedding is a constant that no ablation touches, so zero ablation
  leaves each position's embedding and mean ablation averages token embeddings only.

The two agree for ``counterfactual`` and ``resample`` (the other prompt sits at the same
positions) and for models without learned position embeddings (rotary, none).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from circuitstat.core.errors import InputError
from .engine.config import compute_dtype
from .methods import ABLATIONS  # noqa: F401 - declared once with the methods (torch-free, read by the CLI)
from .model import CircuitModel

INPUT_NODES = ("embeddings", "tokens")


def check_input_node(input_node: str) -> str:
    """``input_node`` itself; InputError unless it is one of INPUT_NODES."""
    if input_node not in INPUT_NODES:
        raise InputError(f"unknown input_node {input_node!r}; use 'embeddings' (token + position, the default) "
                         "or 'tokens' (token embedding only, as EAP-IG/MIB)")
    return input_node


class PairData(Protocol):
    """What attribution needs of a task (circuitstat.circuits.tasks.Task): paired ids, masks, a per-example metric."""

    clean: torch.Tensor  # [N, P]
    corrupted: torch.Tensor  # [N, P]
    attention_mask: torch.Tensor  # [N, P]

    def score(self, logits: torch.Tensor, indices: torch.Tensor | None = None,
              clean_logits: torch.Tensor | None = None) -> torch.Tensor: ...


def last_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position of each row's last real token (right padding)."""
    return attention_mask.long().sum(-1) - 1


def derangement(n: int, seed: int) -> np.ndarray:
    """A permutation of range(n) with no fixed point, drawn from ``seed``."""
    if n < 2:
        raise InputError("resample ablation needs at least 2 examples")
    rng = np.random.default_rng(seed)
    while True:
        perm = rng.permutation(n)
        if not np.any(perm == np.arange(n)):
            return perm


class Ablation:
    """Builds the counterfactual sender outputs [B | 1, U, P | 1, D] for batches of a dataset."""

    def __init__(self, kind: str, model: CircuitModel, data: PairData, *, reference: PairData | None = None,
                 seed: int = 0, batch_size: int = 32, input_node: str = "embeddings") -> None:
        if kind not in ABLATIONS:
            raise InputError(f"unknown ablation {kind!r}; use one of {', '.join(ABLATIONS)}")
        self.kind, self.model, self.data = kind, model, data
        self.input_node = check_input_node(input_node)
        # only zero and mean values are built without a prompt at the example's own positions
        self._keep_positions = input_node == "tokens" and kind in ("zero", "mean", "mean-positional") \
            and model.cfg.positional == "learned"
        self.means = None
        self.perm = None
        if kind in ("mean", "mean-positional"):
            self.means = sender_means(model, reference if reference is not None else data,
                                      positional=kind == "mean-positional", batch_size=batch_size,
                                      input_node=self.input_node)
        if kind == "resample":
            self.perm = torch.as_tensor(derangement(data.clean.shape[0], seed), device="cpu")  # indexes the dataset

    def describe(self) -> dict:
        """Parameters that determine the counterfactual, for provenance."""
        return {"ablation": self.kind, "input_node": self.input_node, "resample_perm_head": None if self.perm is None else self.perm[:8].tolist()}

    @torch.no_grad()
    def senders(self, index: torch.Tensor) -> torch.Tensor:
        """Counterfactual sender outputs for the examples ``index`` of the dataset."""
        cf = self._values(index)
        if not self._keep_positions:
            return cf
        # input_node="tokens": the input's value is the ablated token part plus its own position embedding
        mask = self.data.attention_mask[index]
        B, P = mask.shape
        cf = cf.expand(B, -1, P, -1).clone()
        cf[:, 0] += self.model.position_embedding(mask).to(cf.dtype)
        return cf

    def _values(self, index: torch.Tensor) -> torch.Tensor:
        """Counterfactual sender outputs before the input-node convention is applied."""
        m, d = self.model, self.data
        dev = m.device
        if self.kind == "counterfactual":
            return m.run(d.corrupted[index].to(dev), d.attention_mask[index].to(dev), keep_senders=True,
                         compute_logits=False).senders
        if self.kind == "resample":
            other = self.perm[index]
            mask = d.attention_mask[index]
            if not torch.equal(d.attention_mask[other], mask):
                # lengths differ: positions beyond the other prompt would read padding
                if (d.attention_mask[other].sum(-1) < mask.sum(-1)).any():
                    raise InputError("resample ablation needs prompts of equal length; use a task with fixed lengths")
            return m.run(d.clean[other].to(dev), d.attention_mask[other].to(dev), keep_senders=True,
                         compute_logits=False).senders
        if self.kind == "zero":
            g = m.graph
            return torch.zeros(1, g.n_senders, 1, m.cfg.d_model, dtype=m.dtype, device=dev)
        P = d.clean.shape[1]
        means = self.means
        if means.shape[2] != 1:
            if means.shape[2] < P:
                raise InputError(f"mean-positional reference prompts have {means.shape[2]} positions, the task needs {P}")
            means = means[:, :, :P]
        return means.to(dev)


@torch.no_grad()
def sender_means(model: CircuitModel, reference: PairData, positional: bool, batch_size: int = 32,
                 input_node: str = "embeddings", row_weights: np.ndarray | None = None) -> torch.Tensor:
    """Mean output of every sender over the reference's clean prompts: [1, U, 1 or P, D] in the model's dtype.

    Sums in float32 (float64 for a float64 model) over real tokens only and divides once by the total count; with
    ``input_node="tokens"`` the input's mean is that of its token embeddings only; with ``row_weights`` (one
    non-negative weight per prompt, e.g. a bootstrap resample's counts) every token of prompt n counts w_n times.
    """
    check_input_node(input_node)
    N, P = reference.clean.shape
    if N == 0:
        raise InputError("the reference dataset for mean ablation is empty")
    total = None
    # token counts stay on the model's device (no host sync per batch)
    weighted = row_weights is not None
    if weighted:
        row_weights = torch.as_tensor(np.asarray(row_weights, dtype=np.float64), device=model.device)
        if row_weights.shape != (N,):
            raise InputError(f"row_weights must give one weight per reference prompt ({N}), "
                             f"got shape {tuple(row_weights.shape)}")
    count = torch.zeros(P if positional else 1, dtype=compute_dtype(model.dtype) if weighted else torch.int64,
                        device=model.device)
    for start in range(0, N, batch_size):
        sl = slice(start, start + batch_size)
        mask = reference.attention_mask[sl].to(model.device)
        z = model.run(reference.clean[sl].to(model.device), mask, keep_senders=True, compute_logits=False).senders
        if input_node == "tokens":
            z[:, 0] -= model.position_embedding(mask)
        ct = compute_dtype(z.dtype)  # float32 sums (float64 for a float64 model)
        # prompt n's real tokens count w_n times (sums and counts alike)
        tokens = mask.to(ct) * row_weights[sl, None].to(ct) if weighted else mask
        w = tokens.to(ct)[:, None, :, None]
        s = (z.to(ct) * w).sum(0, keepdim=True)  # [1, U, P, D]
        if not positional:
            s = s.sum(2, keepdim=True)
            count += tokens.sum().to(count.dtype)
        else:
            count += tokens.sum(0).to(count.dtype)
        total = s if total is None else total + s
    if positional and bool((count == 0).any()):  # one check after all batches
        raise InputError("mean-positional: some positions have no real token in the reference dataset")
    denom = count.to(total.dtype)
    return (total / denom[None, None, :, None]).to(model.dtype)
