"""Per-token read-outs of attention: attention weights, value-norm weights, contribution weights,
gradient x input; token ablation; attention-sink read-outs.

Everything is read from one CircuitModel forward (``run(keep_patterns=True, keep_qkv=True,
keep_senders=True)``); the statistics built on these arrays live in ``circuitstat.stats.token_importance``
and ``circuitstat.stats.sinks``.

Definitions (head h of layer l, query position i, key position j; u_j = v_j W_O[h] is token j's
value vector written into the residual stream, v_j = LN(x_j) W_V[h] + b_V[h]; a_ij the attention
weight; o_i = sum_j a_ij u_j the head's output without the layer's output bias b_O):

* ``attention``: a_ij.
* ``value_norm`` (Kobayashi et al. 2020, "Attention is not only a weight"): ||a_ij u_j||
  = a_ij ||u_j||. Layer level: ||sum_h a^h_ij u^h_j||.
* ``contribution`` (Cunningham & Muca Cirone 2026, "Contribution Weights", arXiv 2606.07604):
  the projection of token j's attention-weighted value onto the output, a_ij <u_j, o_i> / ||o_i||
  (``projection``; it sums over j to ||o_i||), normalised by ||o_i|| so that a row sums to one:
  ``c_ij = a_ij <u_j, o_i> / ||o_i||^2``. The reading taken here: the abstract defines the
  measure as "projection-based, accounting for attention weight, value magnitude and directional
  alignment with the layer output"; the full text was not available to us, so the exact
  normalisation is ours (sum to one, like an attention row; negative where a token's value opposes
  the output). Layer level: the same with u_j replaced by sum_h a^h_ij u^h_j and o_i by the
  layer's attention output sum_h o^h_i (b_O excluded: it belongs to no token).
* ``grad_input``: the first-order Taylor estimate of the metric drop when token j is ablated,
  dm/dx_j . (x_j - x~_j), with x_j the model's input at position j (token + learned position
  embedding) and x~_j the ablated input (:func:`ablated_inputs`; for ``zero`` ablation this is
  the classic gradient x token embedding). ``mask`` ablation changes no input, so it has no
  embedding baseline: grad_input then keeps the ``zero`` baseline (gradient x token embedding),
  a first-order estimate of the zero-ablation drop, not of the mask drop. (A first-order mask
  estimate would need the gradient of a per-key attention gate, which CircuitModel does not expose.)

Token ablation (:func:`ablation_drops`): ``zero`` and ``mean`` replace the ablated token's token
embedding (its position embedding and every position id are kept); ``mask`` removes the token from
attention -- no other query attends to it in any layer -- while every token keeps its position id
(CircuitModel.run with ``positions``), as if the token were deleted from the prompt with the
positions of the others left as they were. The read-out token cannot be masked: it is the query
the metric is read at, and its own residual stream would still carry it.

Token importance at the read-out position (the metric's position): per measure, the layer-level
row at the read-out position averaged over layers (attention: mean over heads; value_norm: the
layer-level norms normalised to sum to one per layer; contribution: the normalised layer-level
contribution weights); grad_input as defined. Ranking is by value, largest first (signed: a
token whose value opposes the output ranks last).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from circuitstat.core.errors import InputError
from circuitstat.core.params import BATCH_SIZE
from .interventions import Intervention

__all__ = ["MEASURES", "TOKEN_ABLATIONS", "EMBEDDING_ABLATIONS", "TokenWeights", "head_weight_matrices",
           "token_weights", "ablated_inputs", "candidate_mask", "rank_tokens", "random_ranks", "ablation_drops",
           "SinkReadout", "sink_readouts"]

#: token-importance measures, in table order
MEASURES = ("attention", "value_norm", "contribution", "grad_input")
#: how a token is ablated: its token embedding set to zero, or to the mean row of W_E; or masked
#: out of attention (positions kept)
TOKEN_ABLATIONS = ("zero", "mean", "mask")
#: the ablations that replace the token embedding (an input baseline for grad_input)
EMBEDDING_ABLATIONS = ("zero", "mean")


def _head_outputs(model, run, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pattern [B, H, P, P], value vectors in the residual stream u [B, H, P, D] and outputs o [B, H, P, D]."""
    blk = model.blocks[layer]
    pattern = run.patterns[layer].float()
    v = run.qkv[layer][2].float()  # [B, H, P, E]
    u = torch.matmul(v, blk.W_O.float())  # [B, H, P, D]: u_j = v_j W_O[h]
    per_layer = 2 if model.cfg.has_mlp else 1
    o = run.blocks[1 + layer * per_layer].float()  # [B, H, P, D], the heads' outputs without b_O
    return pattern, u, o


def head_weight_matrices(model, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                         ) -> dict[str, np.ndarray]:
    """Return per layer and head the full [B, L, H, P, P] matrices of attention, value_norm, contribution.

    Row i, column j: what key token j carries into the head's output at query position i (the
    module docstring's definitions). For heatmaps; the read-out-position vectors come from
    :func:`token_weights`.
    """
    with torch.no_grad():
        run = model.run(ids, attention_mask, keep_patterns=True, keep_qkv=True, keep_senders=True,
                        compute_logits=False)
        att, kob, con = [], [], []
        for layer in range(model.cfg.n_layers):
            a, u, o = _head_outputs(model, run, layer)
            att.append(a)
            kob.append(a * u.norm(dim=-1)[:, :, None, :])
            dots = torch.matmul(o, u.transpose(-1, -2))  # [B, H, Pi, Pj] = <u_j, o_i>
            den = (o * o).sum(-1)[..., None]
            con.append(torch.where(den > 0, a * dots / den.clamp_min(1e-30), torch.zeros_like(dots)))
    stack = lambda xs: torch.stack(xs, 1).cpu().numpy().astype(np.float64)  # noqa: E731
    return {"attention": stack(att), "value_norm": stack(kob), "contribution": stack(con)}


@dataclass
class TokenWeights:
    """Token weights at each prompt's read-out position (see the module docstring).

    Head level ``[N, L, H, P]``: ``attention``, ``value_norm``, ``projection``, ``contribution``;
    layer level ``[N, L, P]``: ``layer_value_norm``, ``layer_contribution``; ``head_output_norm``
    ``[N, L, H]`` (||o_i||); ``grad_input`` ``[N, P]``; ``mask`` ``[N, P]`` real tokens at or
    before the read-out position; ``readout`` ``[N]``; ``metric`` ``[N]`` the clean metric.
    """

    attention: np.ndarray
    value_norm: np.ndarray
    projection: np.ndarray
    contribution: np.ndarray
    layer_value_norm: np.ndarray
    layer_contribution: np.ndarray
    head_output_norm: np.ndarray
    grad_input: np.ndarray
    mask: np.ndarray
    readout: np.ndarray
    metric: np.ndarray

    def importance(self, measure: str) -> np.ndarray:
        """Return the per-token importance ``[N, P]`` of ``measure`` (NaN outside ``mask``)."""
        if measure == "attention":
            score = self.attention.mean(axis=2).mean(axis=1)
        elif measure == "value_norm":
            total = self.layer_value_norm.sum(axis=-1, keepdims=True)
            with np.errstate(invalid="ignore", divide="ignore"):
                score = np.where(total > 0, self.layer_value_norm / np.where(total > 0, total, 1), 0.0).mean(axis=1)
        elif measure == "contribution":
            score = self.layer_contribution.mean(axis=1)
        elif measure == "grad_input":
            score = self.grad_input
        else:
            raise InputError(f"unknown token-importance measure {measure!r}; use one of {', '.join(MEASURES)}")
        return np.where(self.mask, score, np.nan)


def _readout_rows(model, run, last: torch.Tensor) -> dict[str, torch.Tensor]:
    """Head- and layer-level weights at row ``last`` of every prompt, stacked over layers."""
    B = last.shape[0]
    ar = torch.arange(B, device=last.device)
    out: dict[str, list] = {k: [] for k in ("attention", "value_norm", "projection", "contribution",
                                            "layer_value_norm", "layer_contribution", "head_output_norm")}
    for layer in range(model.cfg.n_layers):
        pattern, u, o = _head_outputs(model, run, layer)
        a = pattern[ar, :, last]  # [B, H, P]
        oi = o[ar, :, last]  # [B, H, D]
        onorm = oi.norm(dim=-1)  # [B, H]
        dots = torch.einsum("bhpd,bhd->bhp", u, oi)
        safe = onorm.clamp_min(1e-30)[..., None]
        proj = torch.where(onorm[..., None] > 0, a * dots / safe, torch.zeros_like(dots))
        out["attention"].append(a)
        out["value_norm"].append(a * u.norm(dim=-1))
        out["projection"].append(proj)
        out["contribution"].append(torch.where(onorm[..., None] > 0, proj / safe, torch.zeros_like(proj)))
        out["head_output_norm"].append(onorm)
        per_token = (a[..., None] * u).sum(1)  # [B, P, D]: sum_h a^h_ij u^h_j
        o_layer = oi.sum(1)  # [B, D]
        den = (o_layer * o_layer).sum(-1, keepdim=True)  # [B, 1]
        out["layer_value_norm"].append(per_token.norm(dim=-1))
        lc = torch.einsum("bpd,bd->bp", per_token, o_layer)
        out["layer_contribution"].append(torch.where(den > 0, lc / den.clamp_min(1e-30), torch.zeros_like(lc)))
    return {k: torch.stack(v, 1) for k, v in out.items()}


def _metric(task, logits: torch.Tensor, rows: torch.Tensor, clean_logits: torch.Tensor | None = None) -> torch.Tensor:
    """The task's metric of read-out logits ``[R, V]`` for task rows ``rows``."""
    return task.score(logits, indices=rows, clean_logits=clean_logits)


def _check_ablation(ablation: str) -> None:
    """None; InputError if ``ablation`` is not one of TOKEN_ABLATIONS."""
    if ablation not in TOKEN_ABLATIONS:
        raise InputError(f"unknown token ablation {ablation!r}; use one of {', '.join(TOKEN_ABLATIONS)}")


def ablated_inputs(model, ids: torch.Tensor, attention_mask: torch.Tensor, ablate: torch.Tensor,
                   ablation: str = "zero") -> torch.Tensor:
    """Return the input sender's output [B, P, D] with the token embedding at ``ablate`` [B, P] replaced.

    ``zero``: the token embedding becomes zero (the position embedding is kept, so the position
    stays where it was); ``mean``: the mean row of W_E (the average token). ``mask`` changes no
    embedding and is refused here (see :func:`ablation_drops`).
    """
    _check_ablation(ablation)
    if ablation not in EMBEDDING_ABLATIONS:
        raise InputError(f"token ablation {ablation!r} changes no embedding; ablated inputs exist for "
                         f"{' and '.join(EMBEDDING_ABLATIONS)} only")
    x = model.embed(ids, model.positions(attention_mask))
    tok = model.token_embedding(ids)  # as the input sender holds it (Gemma: scaled by √d)
    vocab = torch.arange(model.cfg.vocab_size, device=ids.device)
    base = torch.zeros_like(tok) if ablation == "zero" else model.token_embedding(vocab).mean(0).expand_as(tok)
    return x + ablate[..., None].to(x.dtype) * (base - tok)


def _grad_input(model, task, rows: torch.Tensor, ids, mask, last, ablation: str) -> torch.Tensor:
    """dm/dx_j . (x_j - x~_j) for every position j: [B, P] (float32); mask ablation: the zero baseline."""
    _check_ablation(ablation)
    baseline = ablation if ablation in EMBEDDING_ABLATIONS else "zero"  # mask has no embedding baseline
    x = model.embed(ids, model.positions(mask)).detach()
    x_abl = ablated_inputs(model, ids, mask, torch.ones_like(ids, dtype=torch.bool), baseline).detach()
    x = x.clone().requires_grad_(True)
    with torch.enable_grad():
        logits = model.run(ids, mask, intervention=Intervention.at_sender(0, x), logits_at=last).logits
        clean = logits.detach() if task.metric_name.startswith("kl") else None
        m = _metric(task, logits, rows, clean)
        (g,) = torch.autograd.grad(m.sum(), x)
    return ((x - x_abl) * g).sum(-1).detach().float()


def token_weights(model, task, *, ablation: str = "zero",
                  batch_size: int = BATCH_SIZE.default_for("tokens")) -> TokenWeights:
    """Return every measure's token weights at each prompt's read-out position (last real token).

    ``ablation`` sets grad_input's baseline (``mask``: the zero baseline, see the module docstring).
    """
    parts: list[dict[str, np.ndarray]] = []
    for rows, sub in task.batches(batch_size):
        dev = model.device
        ids, mask = sub.clean.to(dev), sub.attention_mask.to(dev)
        last = sub.last_pos.to(dev)
        with torch.no_grad():
            run = model.run(ids, mask, keep_patterns=True, keep_qkv=True, keep_senders=True, logits_at=last)
            weights = _readout_rows(model, run, last)
            clean = run.logits
            metric = _metric(task, clean, rows, clean if task.metric_name.startswith("kl") else None)
        gi = _grad_input(model, task, rows, ids, mask, last, ablation)
        P = ids.shape[1]
        real = (torch.arange(P, device=dev)[None] <= last[:, None]) & mask.bool()
        part = {k: v.cpu().numpy().astype(np.float64) for k, v in weights.items()}
        part.update(grad_input=gi.cpu().numpy().astype(np.float64), mask=real.cpu().numpy(),
                    readout=last.cpu().numpy(), metric=metric.detach().cpu().numpy().astype(np.float64))
        parts.append(part)
    return TokenWeights(**{k: np.concatenate([p[k] for p in parts]) for k in parts[0]})


# --- token ablation ---------------------------------------------------------------------------------
def candidate_mask(weights: TokenWeights, exclude_first: bool = False, exclude_readout: bool = False) -> np.ndarray:
    """Return [N, P] the tokens that may be ablated: real tokens at or before the read-out, minus exclusions."""
    cand = weights.mask.copy()
    if exclude_first:
        first = np.argmax(weights.mask, axis=1)
        cand[np.arange(cand.shape[0]), first] = False
    if exclude_readout:
        cand[np.arange(cand.shape[0]), weights.readout] = False
    if not cand.any(axis=1).all():
        raise InputError("some prompts have no token left to ablate; allow the first or the read-out token")
    return cand


def rank_tokens(score: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Return [N, P] positions ordered by ``score`` (largest first), non-candidates last (stable ties)."""
    s = np.where(candidates, np.nan_to_num(score, nan=-np.inf), -np.inf)
    # ties keep position order (stable sort of -score), so results do not depend on the platform
    return np.argsort(-s, axis=1, kind="stable")


def random_ranks(candidates: np.ndarray, n_draws: int, rng: np.random.Generator) -> np.ndarray:
    """Return [n_draws, N, P] random orders of each prompt's candidate tokens (non-candidates last)."""
    N, P = candidates.shape
    keys = rng.random((n_draws, N, P))
    keys = np.where(candidates[None], keys, 2.0)  # non-candidates after every candidate
    return np.argsort(keys, axis=2, kind="stable")


def ablation_drops(model, task, orders: np.ndarray, ks: tuple[int, ...], candidates: np.ndarray, *,
                   ablation: str = "zero", batch_size: int = 256) -> np.ndarray:
    """Return [N, R, K] metric drops m(clean) - m(top-k tokens of ``orders`` [R, N, P] ablated).

    k larger than a prompt's number of candidates ablates all of them (never more: the count is
    recorded by the caller through ``candidates``). ``ablation``: one of TOKEN_ABLATIONS (module
    docstring); ``mask`` needs candidates without the read-out token (``exclude_readout``).
    """
    _check_ablation(ablation)
    R, N, P = orders.shape
    if ablation == "mask" and candidates[np.arange(N), task.last_pos.cpu().numpy()].any():
        raise InputError("mask ablation cannot remove the read-out token (the metric's query); exclude it "
                         "from the candidates (exclude_readout, --exclude-readout)")
    n_cand = candidates.sum(axis=1)
    ablate = np.zeros((R, len(ks), N, P), dtype=bool)
    for ki, k in enumerate(ks):
        take = np.minimum(k, n_cand)  # [N]
        first_k = np.arange(P)[None, None, :] < take[None, :, None]  # [1, N, P] rank < k
        np.put_along_axis(ablate[:, ki], orders, np.broadcast_to(first_k, orders.shape), axis=2)
    flat = torch.as_tensor(ablate.transpose(2, 0, 1, 3).reshape(N * R * len(ks), P))
    prompt = torch.arange(N).repeat_interleave(R * len(ks))
    dev = model.device
    out = np.empty(flat.shape[0])
    clean_metric = np.empty(N)
    with torch.no_grad():
        for s in range(0, N, batch_size):
            rows = torch.arange(s, min(N, s + batch_size))
            logits = model.run(task.clean[rows].to(dev), task.attention_mask[rows].to(dev),
                               logits_at=task.last_pos[rows].to(dev)).logits
            clean_metric[rows.numpy()] = _metric(task, logits, rows, logits).cpu().numpy()
        for s in range(0, flat.shape[0], batch_size):
            sl = slice(s, min(flat.shape[0], s + batch_size))
            rows = prompt[sl]
            ids, mask = task.clean[rows].to(dev), task.attention_mask[rows].to(dev)
            last = task.last_pos[rows].to(dev)
            logits = _ablated_logits(model, ids, mask, flat[sl].to(dev), last, ablation)
            clean = None
            if task.metric_name.startswith("kl"):
                clean = model.run(ids, mask, logits_at=last).logits
            out[sl] = _metric(task, logits, rows, clean).cpu().numpy()
    drops = clean_metric[prompt.numpy()] - out
    return drops.reshape(N, R, len(ks))


def _ablated_logits(model, ids: torch.Tensor, mask: torch.Tensor, ablate: torch.Tensor, last: torch.Tensor,
                    ablation: str) -> torch.Tensor:
    """Return read-out logits [B, V] with the tokens at ``ablate`` [B, P] ablated."""
    if ablation == "mask":
        # the masked keys leave the attention mask; positions still count every real token
        keep = mask * ~ablate
        return model.run(ids, keep, positions=model.positions(mask), logits_at=last).logits
    x = ablated_inputs(model, ids, mask, ablate, ablation)
    return model.run(ids, mask, intervention=Intervention.at_sender(0, x), logits_at=last).logits


# --- attention sinks ---------------------------------------------------------------------------------
@dataclass
class SinkReadout:
    """Per prompt, head and query position: attention to the sink token and the head's output norm.

    ``sink_attention`` and ``output_norm`` are ``[N, L, H, P]``; ``positions`` ``[N, P]`` marks
    the query positions that count (real tokens after the sink token); ``sink_position`` ``[N]``;
    ``confidence`` ``[N, P]`` the model's top next-token probability at each position.
    """

    sink_attention: np.ndarray
    output_norm: np.ndarray
    positions: np.ndarray
    sink_position: np.ndarray
    confidence: np.ndarray


SINK_TOKENS = ("first", "detected")


def _detect_sink(patterns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] per prompt the key receiving the most attention: mean over layers, heads and later queries."""
    P = patterns.shape[-1]
    later = (torch.arange(P)[:, None] > torch.arange(P)[None, :]).to(patterns.device)  # query i > key j
    w = later[None, None, None] & mask.bool()[:, None, None, :, None]
    received = (patterns * w).sum((1, 2, 3)) / w.sum((1, 2, 3)).clamp_min(1)  # [B, P]
    received = received.masked_fill(~mask.bool(), -1.0)
    return received.argmax(-1)


def sink_readouts(model, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *, sink: str = "first",
                  batch_size: int = BATCH_SIZE.default_for("tokens")) -> SinkReadout:
    """Return attention to the sink token, head output norms and confidence for every prompt and position.

    ``sink='first'``: the first real token of each prompt (BOS when there is one); ``'detected'``:
    per prompt, the key with the largest mean attention from later queries over all heads.
    """
    if sink not in SINK_TOKENS:
        raise InputError(f"unknown sink token rule {sink!r}; use one of {', '.join(SINK_TOKENS)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(ids)
    parts = []
    per_layer = 2 if model.cfg.has_mlp else 1
    with torch.no_grad():
        for s in range(0, ids.shape[0], batch_size):
            b_ids = ids[s:s + batch_size].to(model.device)
            mask = attention_mask[s:s + batch_size].to(model.device)
            run = model.run(b_ids, mask, keep_patterns=True, keep_senders=True)
            patterns = torch.stack([p.float() for p in run.patterns], 1)  # [B, L, H, P, P]
            B, P = b_ids.shape
            first = mask.long().argmax(-1)
            where = first if sink == "first" else _detect_sink(patterns, mask)
            ar = torch.arange(B, device=b_ids.device)
            att = patterns[ar, :, :, :, where]  # [B, L, H, P]: attention from each query to the sink
            norms = torch.stack([run.blocks[1 + layer * per_layer].float().norm(dim=-1)
                                 for layer in range(model.cfg.n_layers)], 1)  # [B, L, H, P]
            positions = (torch.arange(P, device=b_ids.device)[None] > where[:, None]) & mask.bool()
            conf = run.logits.float().softmax(-1).amax(-1)
            parts.append((att, norms, positions, where, conf))
    cat = lambda i: torch.cat([p[i] for p in parts]).cpu().numpy()  # noqa: E731
    return SinkReadout(cat(0).astype(np.float64), cat(1).astype(np.float64), cat(2), cat(3), cat(4).astype(np.float64))
