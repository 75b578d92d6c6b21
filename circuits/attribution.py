"""Per-example attribution of edges and nodes: exact patching (CMA), EAP, EAP-IG, clean-corrupted.

Every method returns a ScoreMatrix [N, E] (or [N, nodes]); nothing is averaged here.

Sign convention (as the EAP-IG library): Δz_u = z_u(counterfactual) − z_u(clean) and
score = metric(patched) − metric(clean) for exact, Σ_pos Δz_u · ∂m/∂in_v for the gradient methods,
so EAP is the first-order Taylor term of the exact effect.

On post-norm models (Gemma 2/3, OLMo 2: the summed attention output is normalised before the
residual add; see circuitstat.circuits.engine.run) an edge from head u of layer l carries N_l(S_l + Δz_u) −
N_l(S_l) into its receiver: that is what exact patching adds, and the gradient methods use its
first-order term J_N(S_l) Δz_u at each point where they take a gradient (so they contract each
gradient run with its own linearisation instead of pooling gradients first).

Cost of ``exact``: an intervention at a receiver in layer L leaves layers < L unchanged, so each
edge (n, u → v) costs one *suffix* forward from v's layer.  All receivers of one layer share
each batched suffix (rows = receiver x example x sender); positions before the first one where
Δz_u is nonzero keep their clean keys and values, positions after the read-out are dropped, and
the last layer runs at the read-out only.  The suffix is still nonlinear in every row, so against
one full forward per edge the gain is bounded by the flop ratio (about 11x at 2 layers, 4.4x at
6, 3.6x at 12 for 4 heads of d_model 128 with the corruption at the first token; more when the
corruption starts later; see bench/attribution.py).  Edges whose Δz is zero wherever their
receiver can reach the read-out are not computed and score exactly 0.0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from circuitstat.core.errors import InputError
from circuitstat.core.params import BATCH_SIZE, IG_STEPS, SEED

from .ablation import Ablation, PairData, check_input_node, last_index
from .interventions import Intervention
from .engine.masks import allowed_keys
from .engine.run import RunState
from .contraction import check_metric, edge_scores_from_grads
# the methods, their levels, ablations and runners: records in circuitstat.circuits.methods (names re-exported)
from .methods import ABLATIONS, ATP_METHODS, ENSEMBLE_MEMBERS, LEVELS, METHODS, method as method_record, runner  # noqa: F401
from .model import CircuitModel
from .scores import ScoreMatrix
from .plan import suffix_flops
from .threads import given_cores, sized_threads, split_calls

@dataclass(frozen=True)
class BatchJob:
    """What a method's batch scorer needs beyond the batch: the method, level and options of the run."""

    method: str
    level: str
    ig_steps: int
    max_rows: int
    keep: "np.ndarray | None" = None  # exact: the (example, edge) cells of this batch to compute (None: all)
    cf_owned: bool = False  # the counterfactual senders were computed for this batch alone and may be overwritten


def _positive_int(what: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{what} must be a positive integer, got {value!r}")


def check_options(method: str, level: str = "edge", ablation: "str | Ablation" = "counterfactual", *,
                  batch_size: int = BATCH_SIZE.default, ig_steps: int = IG_STEPS.default) -> None:
    """None; InputError naming the first attribution option that is unknown, out of range or
    incompatible with another (checked before any work or any file is written)."""
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")
    if level not in LEVELS:
        raise InputError(f"unknown level {level!r}; use edge or node")
    if isinstance(ablation, str) and ablation not in ABLATIONS:
        raise InputError(f"unknown ablation {ablation!r}; use one of {', '.join(ABLATIONS)}")
    _positive_int("batch_size", batch_size)
    _positive_int("ig_steps", ig_steps)
    rec = method_record(method)
    if level not in rec.levels:
        # e.g. AtP*'s GradDrop sums absolute values per edge, so a node's score is not the sum of its out-edges'
        raise InputError(f"{method} scores {' and '.join(x + 's' for x in rec.levels)} only ({rec.summary}); use level "
                         f"{rec.levels[0]!r}, or eap for {level} scores")
    kind = ablation if isinstance(ablation, str) else getattr(ablation, "kind", "custom")
    if rec.ablations != ABLATIONS and kind not in rec.ablations:  # a custom Ablation object: any unrestricted method
        # clean-corrupted: with mean/zero/resample values there is no corrupted *input* to take a gradient at, and
        # at the all-edges-patched point every receiver is cut off from its downstream path
        raise InputError(f"{method} needs ablation {' or '.join(map(repr, rec.ablations))} ({rec.summary}), "
                         f"got {kind!r}; use eap or eap-ig-inputs with this ablation")


def uses_ig_steps(method: str) -> bool:
    """True when ``method``'s scores depend on ig_steps (its record says: EAP-IG and the ensemble that contains it)."""
    return method_record(method).ig_steps


def edges_to_nodes(model: CircuitModel, edge_scores: torch.Tensor) -> torch.Tensor:
    """Sum of each sender's out-edge scores: [B, U] (the node score of linear methods)."""
    g = model.graph
    idx = torch.as_tensor(g.edge_sender, device=edge_scores.device)
    return torch.zeros(edge_scores.shape[0], g.n_senders, device=edge_scores.device).index_add_(1, idx, edge_scores)


class _Batch:
    """One batch of examples moved to the model's device; its clean run is computed on first use."""

    def __init__(self, model: CircuitModel, data: PairData, index: torch.Tensor, keep_resid: bool) -> None:
        dev = model.device
        self.model, self.data, self.keep_resid = model, data, keep_resid
        self.index = index
        self.clean = data.clean[index].to(dev)
        self.corrupted = data.corrupted[index].to(dev)
        self.mask = data.attention_mask[index].to(dev)
        self.last = last_index(self.mask)
        self._run = None

    @property
    def run(self):
        """The clean run (senders, logits at the last token; residuals and q/k/v for exact)."""
        if self._run is None:
            with torch.no_grad():
                self.set_clean(self.model.run(self.clean, self.mask, keep_senders=True, keep_resid=self.keep_resid,
                                              keep_qkv=self.keep_resid, logits_at=self.last))
        return self._run

    def set_clean(self, out) -> None:
        """Adopt ``out`` (a clean run, possibly with gradients) as this batch's clean run."""
        self._run = out
        self._clean_last = out.logits.detach().float()  # metrics in float32 whatever the model's dtype
        self._m0 = self.data.score(self._clean_last, indices=self.index, clean_logits=self._clean_last).float()
        check_metric(self._m0, self.index, "clean run")

    @property
    def clean_last(self) -> torch.Tensor:
        """Clean logits at each example's last real token [B, V]."""
        self.run  # noqa: B018 - computes the clean run if needed
        return self._clean_last

    @property
    def m0(self) -> torch.Tensor:
        """The metric on the clean run [B]."""
        self.run  # noqa: B018 - computes the clean run if needed
        return self._m0


def _grad_run(model, data, batch: _Batch, ids, intervention=None, clean: bool = False, lazy: bool = False,
              with_run: bool = False):
    """Receiver gradients of the summed metric for one (possibly intervened) run: a list, or with
    ``lazy`` an iterator over receiver groups (each computed when it is reached, so a consumer that
    contracts them one by one never holds every layer's gradients at once).

    ``clean=True`` marks the unpatched clean run: it also becomes the batch's clean run, which
    saves EAP a separate forward.
    """
    with torch.enable_grad():
        out = model.run(ids, batch.mask, intervention=intervention, receiver_grads="projected",
                        logits_at=batch.last, keep_senders=clean)
        if clean:
            batch.set_clean(out)
        metric = data.score(out.logits.float(), indices=batch.index, clean_logits=batch.clean_last)
        check_metric(metric.detach(), batch.index, "gradient run")
        grads = model.iter_receiver_input_grads(out, torch.autograd.grad(metric.sum(), out.grad_inputs))
        grads = grads if lazy else list(grads)
        return (grads, out) if with_run else grads


def _linear_scores(model, out, dz: torch.Tensor, grads) -> torch.Tensor:
    """[B, E] Σ_pos J Δz_u · g_v at the gradient point of run ``out`` (post-norm models: heads' Δz
    through the linearised post-norm of that run; others: Δz itself)."""
    return edge_scores_from_grads(model, model.sender_write_deltas(out, dz.clone(), linear=True), grads)


def _delta(cf: torch.Tensor, clean: torch.Tensor, owned: bool) -> torch.Tensor:
    """Δz = counterfactual − clean sender outputs; in place in ``cf`` when the caller owns it and it
    has the full shape (saves one [B, U, P, D] buffer: 463 MB for GPT-2 small at 24 x 40 tokens)."""
    if owned and cf.shape == clean.shape and not cf.requires_grad:
        return cf.sub_(clean)
    return cf - clean


def _eap(model, data, batch, cf, method: str, steps: int, cf_owned: bool = False) -> torch.Tensor:
    """[B, E] scores of a gradient method for one batch (``cf_owned``: ``cf`` may be overwritten)."""
    g = model.graph
    if method == "eap":
        grads = _grad_run(model, data, batch, batch.clean, clean=True, lazy=True)
        dz = _delta(cf, batch.run.senders.detach(), cf_owned)
        return edge_scores_from_grads(model, model.sender_write_deltas(batch.run, dz, linear=True), grads)
    if not model.cfg.additive_writes:
        return _eap_per_point(model, data, batch, cf, method, steps)
    if method == "clean-corrupted":
        a = _grad_run(model, data, batch, batch.clean, clean=True, lazy=True)
        b = _grad_run(model, data, batch, batch.corrupted, lazy=True)
        grads = ((x + y) / 2 for x, y in zip(a, b))
        return edge_scores_from_grads(model, _delta(cf, batch.run.senders.detach(), cf_owned), grads)
    delta = cf - batch.run.senders
    if method == "eap-ig-inputs":
        # Integrated gradients along input embeddings from counterfactual (k=0) towards clean,
        # k = 0..m-1 as in the EAP-IG library's get_scores_eap_ig.
        total = None
        for k in range(steps):
            alpha = k / steps
            sm = torch.zeros(g.n_senders, device=cf.device)
            sm[0] = 1 - alpha
            grads = _grad_run(model, data, batch, batch.clean, Intervention.nodes(sm, cf))
            total = list(grads) if total is None else [t + x for t, x in zip(total, grads)]
        return edge_scores_from_grads(model, delta, [t / steps for t in total])
    if method == "eap-ig-activations":
        # Per sender group (input, one layer's heads, one MLP): IG along that group's outputs,
        # interpolated from counterfactual to clean (k = 1..m), used for that group's out-edges.
        # (The EAP-IG library pools these gradients over all groups; keeping them per group makes
        # each edge's score an integrated gradient along its own sender's path.)
        out = torch.zeros(batch.clean.shape[0], g.n_edges, device=cf.device)
        for members in _ig_groups(model):
            total = None
            for k in range(1, steps + 1):
                alpha = k / steps
                sm = torch.zeros(g.n_senders, device=cf.device)
                sm[members] = 1 - alpha
                grads = _grad_run(model, data, batch, batch.clean, Intervention.nodes(sm, cf))
                total = list(grads) if total is None else [t + x for t, x in zip(total, grads)]
            keep = torch.zeros(1, g.n_senders, 1, 1, device=cf.device)
            keep[:, members] = 1
            out += edge_scores_from_grads(model, delta * keep, [t / steps for t in total])
        return out
    raise InputError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")


def score_gradient(model, data, batch, cf, job: BatchJob) -> torch.Tensor:
    """[B, E] (or [B, U] at node level: each sender's out-edges summed) scores of EAP, EAP-IG or clean-corrupted."""
    s = _eap(model, data, batch, cf, job.method, job.ig_steps, cf_owned=job.cf_owned)
    return edges_to_nodes(model, s) if job.level == "node" else s


def score_ensemble(model, data, batch, cf, job: BatchJob) -> torch.Tensor:
    """[B, E] (or [B, U]) the ensemble's scores: the mean of its members' (``cf`` shared, never overwritten)."""
    s = _ensemble(model, data, batch, cf, job.ig_steps)
    return edges_to_nodes(model, s) if job.level == "node" else s


def score_exact(model, data, batch, cf, job: BatchJob) -> torch.Tensor:
    """[B, E] exact edge effects by batched suffix recomputation, or [B, U] node effects."""
    if job.level == "edge":
        return _exact_edges(model, data, batch, cf, job.max_rows, job.keep)
    return _exact_nodes(model, data, batch, cf)


def _ensemble(model, data, batch, cf, steps: int) -> torch.Tensor:
    """[B, E] the mean of the ENSEMBLE_MEMBERS' scores for one batch (``cf`` is shared, never overwritten)."""
    total, members = None, method_record("ensemble").members
    for member in members:
        s = _eap(model, data, batch, cf, member, steps, cf_owned=False)
        total = s if total is None else total + s
    return total / len(members)


def _ig_groups(model) -> list[list[int]]:
    """EAP-IG-activations' sender groups: the input, each layer's heads, each MLP (all its expert senders)."""
    g = model.graph
    groups = [[0]]
    for layer in range(model.cfg.n_layers):
        groups.append([g.head_sender(layer, h) for h in range(model.cfg.n_heads)])
        if model.cfg.has_mlp:
            groups.append(list(g.mlp_senders(layer)))  # experts as nodes: a layer's experts together
    return groups


def _eap_per_point(model, data, batch, cf, method: str, steps: int) -> torch.Tensor:
    """[B, E] scores of clean-corrupted or EAP-IG on a post-norm model: each gradient run contracted
    with the writes linearised at its own point (the same estimators as the pooled forms otherwise)."""
    g = model.graph
    if method == "clean-corrupted":
        # the clean gradient run is the batch's clean run too (no separate clean forward, as _eap's)
        grads, out = _grad_run(model, data, batch, batch.clean, clean=True, with_run=True)
        dz = (cf - batch.run.senders).detach()
        total = _linear_scores(model, out, dz, grads) / 2
        grads, out = _grad_run(model, data, batch, batch.corrupted, with_run=True)
        return total + _linear_scores(model, out, dz, grads) / 2
    batch.run  # noqa: B018 - the clean run (senders, metric) first
    dz = (cf - batch.run.senders).detach()
    if method == "eap-ig-inputs":
        total = 0
        for k in range(steps):
            sm = torch.zeros(g.n_senders, device=cf.device)
            sm[0] = 1 - k / steps
            grads, out = _grad_run(model, data, batch, batch.clean, Intervention.nodes(sm, cf), with_run=True)
            total = total + _linear_scores(model, out, dz, grads) / steps
        return total
    out_scores = torch.zeros(batch.clean.shape[0], g.n_edges, device=cf.device)
    for members in _ig_groups(model):
        keep = torch.zeros(1, g.n_senders, 1, 1, device=cf.device)
        keep[:, members] = 1
        for k in range(1, steps + 1):
            sm = torch.zeros(g.n_senders, device=cf.device)
            sm[members] = 1 - k / steps
            grads, out = _grad_run(model, data, batch, batch.clean, Intervention.nodes(sm, cf), with_run=True)
            out_scores += _linear_scores(model, out, dz * keep, grads) / steps
    return out_scores


def _reach(model: CircuitModel, batch: "_Batch", delta: torch.Tensor) -> dict[str, np.ndarray]:
    """Where each sender's Δz can change the read-out, per example (one host transfer per batch).

    ``any`` [B, U]: Δz is nonzero at some position the read-out attends to (in the last layer)
    or can reach through later layers: the real tokens up to it (causal; padding keys are masked).
    ``read`` [B, U]: Δz is nonzero at the read-out position itself, all that the last layer's q
    and MLP inputs and the logits read.  ``first`` [B, U]: first position where ``any`` holds;
    positions before it stay clean in every layer of the patched run.
    """
    B = delta.shape[0]
    ar = torch.arange(B, device=delta.device)
    # full causal attention: a sliding window only narrows what reaches the read-out, so this
    # superset keeps every row that matters (rows it keeps in vain just score their exact 0 effect)
    sees = allowed_keys(batch.mask)[ar, 0, batch.last][:, : delta.shape[2]]  # [B, P]
    nonzero = (delta != 0).any(-1)  # [B, U, P]
    reach = nonzero & sees[:, None]
    out = {"any": reach.any(-1), "read": nonzero[ar, :, batch.last], "first": reach.to(torch.uint8).argmax(-1)}
    return {k: v.cpu().numpy() for k, v in out.items()}


def _layer_rows(model: CircuitModel, layer: int, reach: dict[str, np.ndarray], last: np.ndarray):
    """Row groups (receiver, local receivers or None, examples, senders, window starts) of one layer.

    One group holds all of a layer's q/k/v receivers (local index kind * H + head per row); the
    MLP (or logits) receiver is another.  Rows whose Δz cannot reach the read-out through their
    receiver are left out: their effect is exactly zero.
    """
    g, cfg = model.graph, model.cfg
    H = cfg.n_heads
    final = layer == cfg.n_layers
    read_start = np.broadcast_to(last[:, None], reach["first"].shape)

    def live(U: int, read_only: bool):
        n, u = np.nonzero(reach["read" if read_only else "any"][:, :U])
        return n, u, (read_start if read_only else reach["first"])[n, u]

    groups = []
    if not final:
        U = g.upstream_of_attention(layer)
        parts = []
        for local in range(3 * H):
            # the last layer's queries matter at the read-out position only
            n, u, st = live(U, layer == cfg.n_layers - 1 and local < H)
            parts.append((np.full(len(n), local), n, u, st))
        loc, n, u, st = (np.concatenate(p) for p in zip(*parts))
        groups.append((layer * g.receivers_per_layer + loc, loc, n, u, st))
    if final or cfg.has_mlp:
        U = g.n_senders if final else g.upstream_of_mlp(layer)
        n, u, st = live(U, final or layer == cfg.n_layers - 1)
        receiver = g.logits_receiver if final else g.mlp_receiver(layer)
        groups.append((np.full(len(n), receiver), None, n, u, st))
    return groups


MIN_ROWS = 8
"""Fewest rows of a suffix call: smaller ones repeat their rows.  MKL's GEMM rounds differently for
fewer than about 5 rows (a GEMV-like path: measured, every row of a 1-3 row product differs in its
last bits from the same row in a larger one), and the read-out layers multiply one row per suffix
row; so a row's result would depend on how many rows shared its call."""


def _row_chunks(start: np.ndarray, end: np.ndarray, max_rows: int):
    """(rows, start, end) chunks of suffix rows: rows of one call share their window [start, end).

    Each row's window is its own (the first position its Δz can matter, one past its read-out), never
    widened to its call-mates': so a row's result does not depend on which rows are computed with it
    (a subset of rows or edges gets the bits of the full run; circuitstat.circuits.verify)."""
    if not len(start):
        return
    order = np.lexsort((end, -start))  # later starts first, then by read-out
    key = np.stack((start[order], end[order]), 1)
    cuts = np.flatnonzero((np.diff(key, axis=0) != 0).any(1)) + 1
    for group in np.split(order, cuts):
        for chunk in np.array_split(group, -(-len(group) // max_rows)):
            yield chunk, int(start[chunk[0]]), int(end[chunk[0]])


@torch.no_grad()
def _exact_edges(model, data, batch, cf, max_rows: int, keep: np.ndarray | None = None) -> torch.Tensor:
    """[B, E] exact per-example edge effects by batched suffix recomputation.

    All receivers of one layer share each suffix forward (rows = receiver x example x sender,
    ``max_rows`` at a time); an edge whose Δz is zero wherever its receiver can affect the
    read-out is not computed and scores exactly 0.0.  ``keep`` [B, E] bool: compute only those
    (example, edge) rows (the others are NaN); a row's suffix does not depend on which other rows
    share its call (:func:`_row_chunks`, :data:`MIN_ROWS`), so the calls are independent and run on
    the cores the caller is given (circuitstat.circuits.threads.split_calls), each on one thread.
    """
    g, cfg = model.graph, model.cfg
    dev = batch.clean.device
    last = batch.last
    window_end = int(last.max()) + 1  # later positions never reach any read-out
    delta = (cf - batch.run.senders)[:, :, :window_end]
    delta = delta.expand(batch.clean.shape[0], -1, window_end, -1)
    delta = model.sender_write_deltas(batch.run, delta)  # post-norm heads: N(S + Δz) − N(S)
    reach = _reach(model, batch, delta)
    last_np = last.cpu().numpy()
    out = torch.zeros(batch.clean.shape[0], g.n_edges, device=dev)
    if keep is not None:
        out[torch.as_tensor(~keep, device=dev)] = float("nan")
    calls, costs = [], []
    for layer in range(cfg.n_layers + 1):
        for receiver, local, n_np, u_np, start_np in _layer_rows(model, layer, reach, last_np):
            cols_np = g.edge_offset[receiver] + u_np
            if keep is not None:  # only the selected edges' rows
                sel = keep[n_np, cols_np]
                receiver = receiver if np.ndim(receiver) == 0 else receiver[sel]
                local = None if local is None else local[sel]
                n_np, u_np, start_np, cols_np = n_np[sel], u_np[sel], start_np[sel], cols_np[sel]
            for rows, start, end in _row_chunks(start_np, last_np[n_np] + 1, max_rows):
                first = int(receiver if np.ndim(receiver) == 0 else receiver[rows[0]])
                calls.append((layer, rows, local, n_np, u_np, cols_np, start, end))
                costs.append(len(rows) * suffix_flops(cfg, g, first, window_end))
    batch.m0  # noqa: B018 - the clean metric, computed once before the calls share it

    def patch(call) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(examples, edge columns, effects) of one suffix call (independent of the others)."""
        layer, rows, local, n_np, u_np, cols_np, start, end = call
        k = len(rows)
        chunk = np.resize(rows, max(k, MIN_ROWS))  # small calls padded with repeats (MIN_ROWS)
        n = torch.as_tensor(n_np[chunk], device=dev)
        u = torch.as_tensor(u_np[chunk], device=dev)
        loc = None if local is None else torch.as_tensor(local[chunk], device=dev)
        logits = model.patched_layer_logits(batch.run, batch.mask, layer, loc, n, delta[n, u, start:end],
                                            last[n], start=start)[:k]
        n = n[:k]
        m = data.score(logits.float(), indices=batch.index[n_np[rows]], clean_logits=batch.clean_last[n]).float()
        return n, torch.as_tensor(cols_np[rows], device=dev), m - batch.m0[n]

    workers = given_cores() if dev.type == "cpu" else 1
    for n, cols, effect in split_calls(patch, calls, costs, workers):
        out[n, cols] = effect
    return out


@torch.no_grad()
def _exact_nodes(model, data, batch, cf) -> torch.Tensor:
    """[B, U] exact per-example node effects: each sender's output replaced everywhere."""
    g = model.graph
    B = batch.clean.shape[0]
    cf = cf.expand(B, -1, batch.clean.shape[1], -1)
    out = torch.empty(B, g.n_senders, device=cf.device)
    for u in range(g.n_senders):
        layer = int(g.sender_layer[u])
        state = None if layer < 0 else RunState(layer, batch.run.resid_pre[layer])
        res = model.run(batch.clean, batch.mask, state=state, intervention=Intervention.at_sender(u, cf[:, u]),
                        logits_at=batch.last)
        out[:, u] = data.score(res.logits.float(), indices=batch.index, clean_logits=batch.clean_last).float() - batch.m0
    return out


def _edge_selection(model: CircuitModel, method: str, level: str, edges, n_rows: int) -> np.ndarray | None:
    """[n_rows, E] bool of the (example, edge) cells to compute (None: all); InputError for a bad selection.

    ``edges``: edge indices (for every row) or an [n_rows, E] bool mask (per row)."""
    if edges is None:
        return None
    if not method_record(method).passes.suffix or level != "edge":
        raise InputError("edges= selects exact patching's edges; use method 'exact' at level 'edge'")
    idx, E = np.asarray(edges), model.graph.n_edges
    if idx.dtype == bool and idx.shape == (n_rows, E):
        return idx.copy()
    if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer) or idx.min() < 0 or idx.max() >= E:
        raise InputError(f"edges must be a non-empty list of edge indices in [0, {E}) (see ComponentGraph.edge_names) "
                         f"or a [{n_rows}, {E}] bool mask")
    keep = np.zeros((n_rows, E), dtype=bool)
    keep[:, idx] = True
    return keep


def _in_dtype(model: CircuitModel, dtype: torch.dtype | None) -> CircuitModel:
    """``model`` itself, or a copy cast to floating-point ``dtype``."""
    if dtype is None or dtype == model.dtype:
        return model
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InputError(f"dtype must be a floating-point torch dtype such as torch.bfloat16, got {dtype!r}")
    import copy

    return copy.deepcopy(model).to(dtype)


def _check_inputs(model: CircuitModel, data: PairData, method: str, level: str, ablation, *, batch_size: int,
                  ig_steps: int, max_rows: int) -> None:
    """Refuse (InputError) what ``attribute`` cannot run: a non-circuit model, bad options, an empty or mis-shaped dataset."""
    from .inmemory import require_circuit_model

    require_circuit_model(model, "attribute")
    check_options(method, level, ablation, batch_size=batch_size, ig_steps=ig_steps)
    if method_record(method).additive_only and not model.cfg.additive_writes:
        raise InputError(f"{method} is defined where each sender's write is added to the residual stream; this model "
                         "normalises its attention output after the heads (post-norm); use eap or exact here")
    if int(data.clean.shape[0]) == 0:
        raise InputError("the dataset is empty; give at least one example")
    if data.corrupted.shape != data.clean.shape:
        raise InputError(f"clean {tuple(data.clean.shape)} and corrupted {tuple(data.corrupted.shape)} ids differ in shape")
    _positive_int("max_rows", max_rows)


def _resolve_ablation(ablation, model: CircuitModel, data: PairData, *, reference: PairData | None, seed: int,
                      batch_size: int, input_node: str | None):
    """The Ablation that gives each batch's counterfactual senders: built from its name, or the given object (anything
    with .kind and .senders(index): custom counterfactuals), whose own input node wins."""
    if input_node is not None:
        check_input_node(input_node)
    if not isinstance(ablation, str):
        own = getattr(ablation, "input_node", "embeddings")
        if input_node is not None and input_node != own:
            raise InputError(f"input_node={input_node!r} differs from the given ablation's {own!r}; "
                             "set it on the Ablation object only")
        return ablation
    return Ablation(ablation, model, data, reference=reference, seed=seed, batch_size=batch_size,
                    input_node=input_node or "embeddings")


@sized_threads  # small calls on one thread, large ones on the cores (circuitstat.circuits.threads)
def attribute(
    model: CircuitModel,
    data: PairData,
    method: str = "eap",
    *,
    level: str = "edge",
    ablation: "str | Ablation" = "counterfactual",
    reference: PairData | None = None,
    batch_size: int = BATCH_SIZE.default,
    ig_steps: int = IG_STEPS.default,
    max_rows: int = 256,
    seed: int = SEED.default,
    metric_name: str | None = None,
    progress: bool = True,
    rows: "np.ndarray | None" = None,
    input_node: str | None = None,
    dtype: torch.dtype | None = None,
    edges: "np.ndarray | None" = None,
) -> ScoreMatrix:
    """Per-example scores [N, E] (or [N, nodes]) of ``method`` on ``data``.

    ``rows`` restricts the work to those examples (ablations still see the whole dataset, so a
    row's scores do not depend on which other rows are computed with it).  ``input_node`` says
    what the ``input`` sender is when it is zero- or mean-ablated: ``"embeddings"`` (the
    default: token + position embeddings) or ``"tokens"`` (token embedding only, as EAP-IG and
    MIB); see circuitstat.circuits.ablation.  An Ablation object passed as ``ablation`` carries its own.
    ``dtype`` (e.g. torch.bfloat16) runs the model in that dtype (a cast copy, unless it already
    is); norms, softmax, metrics and every score sum stay in float32.
    ``edges`` (exact, edge level): compute only these edge indices; the other columns are NaN
    (not computed).  A row or an edge gets the same bits as in the full run (circuitstat.circuits.verify).
    """
    _check_inputs(model, data, method, level, ablation, batch_size=batch_size, ig_steps=ig_steps, max_rows=max_rows)
    todo = np.arange(int(data.clean.shape[0])) if rows is None else np.asarray(rows, dtype=np.int64)
    keep = _edge_selection(model, method, level, edges, len(todo))
    model = _in_dtype(model, dtype)
    t0 = time.perf_counter()
    abl = _resolve_ablation(ablation, model, data, reference=reference, seed=seed, batch_size=batch_size,
                            input_node=input_node)
    cols = model.graph.n_edges if level == "edge" else model.graph.n_senders
    scores = np.empty((len(todo), cols), dtype=np.float32)
    starts = range(0, len(todo), batch_size)
    rec, score = method_record(method), runner(method)  # its batch scorer (circuitstat.circuits.methods)
    # a counterfactual the built-in Ablation computed for this batch alone may be overwritten
    owned = isinstance(abl, Ablation) and abl.kind in ("counterfactual", "resample")
    for start in tqdm(starts, desc=f"{method} ({level})", disable=not progress, leave=False):
        index = torch.as_tensor(todo[start : start + batch_size], device="cpu")  # indexes the (CPU) dataset
        batch = _Batch(model, data, index, keep_resid=rec.passes.suffix)
        cf = abl.senders(index).to(device=model.device, dtype=model.dtype) if rec.counterfactual else None
        job = BatchJob(method, level, ig_steps, max_rows, None if keep is None else keep[start : start + len(index)],
                       cf_owned=owned)
        s = score(model, data, batch, cf, job)
        scores[start : start + len(index)] = s.detach().float().cpu().numpy()
    params = {"batch_size": batch_size, "seed": seed, "max_rows": max_rows,
              "input_node": getattr(abl, "input_node", "embeddings")}
    if uses_ig_steps(method):
        params["ig_steps"] = ig_steps
    if keep is not None:
        params["edges_computed"] = int(keep.sum())
    return ScoreMatrix(
        scores=scores, graph=model.graph, level=level, method=method, example_ids=todo,
        ablation=abl.kind if rec.counterfactual else "none",  # a method that reads no counterfactual says so
        metric=metric_name or getattr(data, "metric_name", "metric"),
        params=params, provenance={"model": model.identity(), "seconds": time.perf_counter() - t0},
    )
