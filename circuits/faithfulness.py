"""Faithfulness of circuits: run the model with only a circuit's edges live, per example.

For each example n and circuit C, every edge outside C carries its counterfactual value (the
chosen :class:`~circuitstat.circuits.ablation.Ablation`: the corrupted run, a mean, zeros, another example)
and every edge inside C carries whatever flows through the circuit (ACDC's and EAP-IG's
``evaluate_graph`` semantics, :class:`~circuitstat.circuits.interventions.Intervention` ``edges``):

* ``m(C)``: the metric with only C live;
* ``m(∅)``: every edge patched.  Computed by replacing *every sender's output* by its
  counterfactual (a node intervention), which is the same run as an all-patched edge mask but a
  different code path, so ``f(empty circuit) = 0`` checks the edge machinery;
* ``m(M)``: the clean run.

Faithfulness ``f(C) = (m(C) − m(∅)) / (m(M) − m(∅))`` is reported two ways, always both:

* **per example** ``[N, n_circuits]``.  Where ``|m(M) − m(∅)| <= atol + rtol·max(|m(M)|, |m(∅)|)``
  the ablation does not move the metric and f is undefined: it is NaN there, the examples are
  counted (``n_undefined``) and a warning says so; ``mean_per_example`` averages the defined ones;
* **ratio of means** ``(mean m(C) − mean m(∅)) / (mean m(M) − mean m(∅))`` (MIB's definition),
  NaN when its own denominator is ~0 by the same rule.

Curves (:func:`faithfulness_curve`) evaluate a grid of circuit sizes built from one score vector
(top-k or greedy, ``ranking`` an explicit choice), pruned by default as MIB does.  Several
circuits share each forward: rows are (example, circuit) pairs with per-row edge masks, in chunks
of ``max_rows``.  CPR and CMD integrate over the *nominal* circuit sizes, as MIB's
``evaluate_area_under_curve`` does (hannamw/MIB-circuit-track, MIB_circuit_track/evaluation.py): the
requested fractions of all edges (MIB's grid .001, .002, .005, .01, .02, .05, .1, .2, .5, 1, each
circuit the top ⌊fraction · E⌋ edges), or ``k / E`` for a grid of counts; never the share of edges
left after pruning (reported beside it as ``fraction``, MIB's ``weighted_edge_count``), which would
change the areas whenever pruning removes edges.  The integrals are trapezoid sums over the grid:

    CPR = Σ_i (x_{i+1} − x_i) (f_i + f_{i+1}) / 2                  (higher is better)
    CMD = Σ_i (x_{i+1} − x_i) (|1 − f_i| + |1 − f_{i+1}|) / 2      (lower is better)

(the |1 − f| values at grid points are interpolated, not |1 − interpolated f|), over
``[x_min, x_max]`` of the grid; ``log_x=True`` integrates over log x instead (MIB's option).
CPR/CMD are computed on the ratio-of-means curve (MIB's numbers) and per example (NaN for undefined examples).

Metric values are float32 (float64 for a float64 model, so its CPR/CMD match MIB's float64 evaluation to
1e-9: tests/circuits/test_faithfulness.py); means are float64 sums divided once by N.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from circuitstat.core.errors import InputError
from circuitstat.core.params import BATCH_SIZE, SEED
from circuitstat.core.results import Result
from circuitstat.core.seeds import as_seed_sequence, seed_record
from circuitstat.core.topk import TIE_RULE, check_ranking, topk

from .ablation import Ablation, PairData, last_index
from .circuit import Circuit
from .interventions import Intervention
from .model import CircuitModel
from .threads import sized_threads

__all__ = ["FaithfulnessResult", "MIB_FRACTIONS", "curve_areas", "faithfulness", "faithfulness_curve"]

#: MIB's grid of circuit sizes as fractions of all edges.
MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def curve_areas(x: np.ndarray, f: np.ndarray, *, log_x: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(CPR, CMD) of faithfulness curve(s) ``f`` [..., K] over grid ``x`` [K] by the trapezoid rule (MIB).

    ``x`` must be non-decreasing (and positive with ``log_x``).  NaN in a curve gives NaN areas.
    """
    x = np.asarray(x, dtype=np.float64)
    f = np.asarray(f, dtype=np.float64)
    if x.ndim != 1 or f.shape[-1] != x.shape[0]:
        raise InputError(f"curve has {f.shape[-1]} points but the grid has {x.shape}")
    if x.shape[0] < 2:
        raise InputError("an area needs at least two grid points")
    if np.any(np.diff(x) < 0):
        raise InputError("the grid x must be non-decreasing (sort circuits by size)")
    if log_x:
        if np.any(x <= 0):
            raise InputError("log_x needs x > 0: drop the empty circuit (k = 0) from the grid")
        x = np.log(x)
    dx = np.diff(x)
    cpr = np.sum(dx * (f[..., 1:] + f[..., :-1]) / 2, axis=-1)
    gap = np.abs(1.0 - f)
    cmd = np.sum(dx * (gap[..., 1:] + gap[..., :-1]) / 2, axis=-1)
    return cpr, cmd


def _undefined(num_scale_a: np.ndarray, num_scale_b: np.ndarray, den: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    return np.abs(den) <= atol + rtol * np.maximum(np.abs(num_scale_a), np.abs(num_scale_b))


def metric_values(x) -> np.ndarray:
    """Metric values as float32, or float64 when they are float64 (a float64 model's; never narrowed)."""
    x = np.asarray(x)
    return x if x.dtype == np.float64 else x.astype(np.float32)


@dataclass(repr=False)
class FaithfulnessResult(Result):
    """Metric values of circuits, the clean model and the empty circuit per example, and their faithfulness.

    Attributes: ``m_circuit`` [N, C], ``m_clean`` [N], ``m_empty`` [N] (float32; float64 given float64); ``per_example``
    [N, C] f (NaN where undefined); ``undefined`` [N] mask and ``n_undefined``; ``ratio_of_means``
    [C]; ``mean_per_example`` [C] (over defined examples); ``n_edges`` [C], ``fraction`` [C] (edges
    evaluated after pruning / all edges); for curves ``k`` [C], ``x`` [C] (the nominal sizes CPR and
    CMD integrate over), ``cpr``/``cmd`` (ratio-of-means curve) and ``cpr_per_example`` /
    ``cmd_per_example`` [N].
    """

    m_circuit: np.ndarray
    m_clean: np.ndarray
    m_empty: np.ndarray
    n_edges: np.ndarray
    n_graph_edges: int
    labels: list[str]
    params: dict = field(default_factory=dict)
    k: np.ndarray | None = None
    example_ids: np.ndarray | None = None
    circuits: list[Circuit] | None = None
    log_x: bool = False
    main_table = "faithfulness_circuits"

    def __post_init__(self) -> None:
        self.m_circuit, self.m_clean, self.m_empty = (metric_values(v) for v in (self.m_circuit, self.m_clean,
                                                                                 self.m_empty))
        N, C = self.m_circuit.shape
        if self.example_ids is None:
            self.example_ids = np.arange(N, dtype=np.int64)
        self.n_edges = np.asarray(self.n_edges, dtype=np.int64)
        self.fraction = self.n_edges / float(self.n_graph_edges)
        rtol, atol = self.params.get("rtol", 1e-4), self.params.get("atol", 1e-6)
        mc = self.m_circuit.astype(np.float64)
        mM, m0 = self.m_clean.astype(np.float64), self.m_empty.astype(np.float64)
        den = mM - m0
        self.undefined = _undefined(mM, m0, den, rtol, atol)
        self.n_undefined = int(self.undefined.sum())
        safe = np.where(self.undefined, 1.0, den)
        per = (mc - m0[:, None]) / safe[:, None]
        per[self.undefined] = np.nan
        self.per_example = per.astype(np.float32)
        defined = ~self.undefined
        n_def = int(defined.sum())
        self.mean_per_example = (per[defined].sum(0) / n_def) if n_def else np.full(C, np.nan)
        # ratio of means: float64 sums divided once by N
        mean_c = mc.sum(0) / N
        mean_M, mean_0 = mM.sum() / N, m0.sum() / N
        self.mean_m_circuit, self.mean_m_clean, self.mean_m_empty = mean_c, float(mean_M), float(mean_0)
        den_mean = mean_M - mean_0
        self.ratio_undefined = bool(_undefined(np.float64(mean_M), np.float64(mean_0), np.float64(den_mean), rtol, atol))
        self.ratio_of_means = np.full(C, np.nan) if self.ratio_undefined else (mean_c - mean_0) / den_mean
        self.cpr = self.cmd = None
        self.cpr_per_example = self.cmd_per_example = None
        self.x = None
        if self.k is not None:
            self.k = np.asarray(self.k, dtype=np.int64)
            self.x = self._nominal_x()
        if self.k is not None and C >= 2:
            self.cpr, self.cmd = (float(v) for v in curve_areas(self.x, self.ratio_of_means, log_x=self.log_x))
            self.cpr_per_example, self.cmd_per_example = curve_areas(self.x, per, log_x=self.log_x)

    def _nominal_x(self) -> np.ndarray:
        """The nominal size of each curve point: the requested fraction (MIB's percentages) or k / all items."""
        fractions = (self.params.get("curve") or {}).get("fractions")
        if fractions is not None:
            return np.asarray(fractions, dtype=np.float64)
        return self.k.astype(np.float64) / float(self.n_graph_edges)

    # ---- Result protocol ---------------------------------------------------------------------
    def _tables(self) -> dict[str, dict[str, Any]]:
        from circuitstat.core.tables import matrix_to_table

        C = self.m_circuit.shape[1]
        circuits = {
            "circuit": np.arange(C, dtype=np.int64), "label": list(self.labels),
            "k": self.k if self.k is not None else np.full(C, -1, dtype=np.int64),
            "n_edges": self.n_edges, "fraction": self.fraction,
            "x": self.x if self.x is not None else np.full(C, np.nan),
            "faithfulness": self.ratio_of_means, "mean_per_example": self.mean_per_example,
            "n_defined": np.full(C, self.m_circuit.shape[0] - self.n_undefined, dtype=np.int64),
            "mean_m_circuit": self.mean_m_circuit,
            "mean_m_clean": np.full(C, self.mean_m_clean), "mean_m_empty": np.full(C, self.mean_m_empty),
            **self._tie_columns(C),
        }
        ex = matrix_to_table(self.per_example, {"example": self.example_ids}, column="faithfulness", allow_nan=True)
        mc = matrix_to_table(self.m_circuit, column="m_circuit", allow_nan=True)
        examples = {"example": ex.column("example").combine_chunks(),
                    "m_clean": self.m_clean, "m_empty": self.m_empty, "undefined": self.undefined,
                    "faithfulness": ex.column("faithfulness").combine_chunks(),
                    "m_circuit": mc.column("m_circuit").combine_chunks()}
        out = {"faithfulness_circuits": circuits, "faithfulness_examples": examples}
        if self.cpr is not None:
            out["faithfulness_areas"] = {
                "statistic": ["cpr", "cmd"],
                "ratio_of_means": np.asarray([self.cpr, self.cmd]),
                "mean_per_example": np.asarray([_nanmean(self.cpr_per_example), _nanmean(self.cmd_per_example)]),
                "n_defined": np.asarray([int(np.isfinite(self.cpr_per_example).sum()),
                                         int(np.isfinite(self.cmd_per_example).sum())], dtype=np.int64),
                "log_x": [self.log_x, self.log_x],
            }
        return out

    def _tie_columns(self, C: int) -> dict[str, Any]:
        """The tie rule and the edges (nodes) tied at each circuit's cut-off (-1: not a top-k circuit)."""
        curve = self.params.get("curve") or {}
        if self.circuits:
            ps = [c.params for c in self.circuits]
            ties = [p.get("cutoff_ties", -1) for p in ps]
            excluded = [p.get("cutoff_ties_excluded", -1) for p in ps]
            rule = [p.get("ties", "") for p in ps]
        elif "cutoff_ties" in curve:
            ties, excluded, rule = curve["cutoff_ties"], curve["cutoff_ties_excluded"], [curve["ties"]] * C
        else:
            ties, excluded, rule = [-1] * C, [-1] * C, [""] * C
        return {"tie_rule": list(rule), "cutoff_ties": np.asarray(ties, dtype=np.int64),
                "cutoff_ties_excluded": np.asarray(excluded, dtype=np.int64)}

    def _summary_items(self) -> list[tuple[str, Any]]:
        N, C = self.m_circuit.shape
        items: list[tuple[str, Any]] = [
            ("examples", N), ("circuits", C), ("ablation", self.params.get("ablation")),
            ("metric", self.params.get("metric")),
            ("f undefined (|m(M)-m(∅)|≈0)", f"{self.n_undefined} of {N} examples"),
            ("mean m(M), m(∅)", f"{self.mean_m_clean:.6g}, {self.mean_m_empty:.6g}"),
        ]
        for c in range(min(C, 12)):
            items.append((f"f[{self.labels[c]}] (ratio of means / mean per example)",
                          f"{self.ratio_of_means[c]:.4f} / {self.mean_per_example[c]:.4f}"))
        if self.cpr is not None:
            items += [("CPR (∫ f dx, higher better)", self.cpr), ("CMD (∫ |1-f| dx, lower better)", self.cmd)]
        return items


def _nanmean(x: np.ndarray) -> float:
    ok = np.isfinite(x)
    return float(x[ok].sum() / ok.sum()) if ok.any() else float("nan")


def _as_masks(circuits: Any, graph) -> tuple[np.ndarray, list[str], list[Circuit] | None]:
    """Boolean [C, E] masks (True = edge live), labels and the Circuit objects (if given)."""
    if isinstance(circuits, Circuit):
        circuits = [circuits]
    if isinstance(circuits, (list, tuple)) and circuits and all(isinstance(c, Circuit) for c in circuits):
        for c in circuits:
            if (c.graph.n_layers, c.graph.n_heads, c.graph.has_mlp, c.graph.parallel) != (
                    graph.n_layers, graph.n_heads, graph.has_mlp, graph.parallel):
                raise InputError("a circuit was built for a different graph than the model's")
        masks = np.stack([c.edges for c in circuits])
        labels = [f"{c.rule}:{c.n_edges}" for c in circuits]
        return masks, labels, list(circuits)
    arr = np.asarray(circuits)
    if arr.dtype != bool:
        raise InputError("pass Circuit objects or boolean edge masks [E] / [C, E] (True = edge in the circuit)")
    arr = np.atleast_2d(arr)
    if arr.ndim != 2 or arr.shape[1] != graph.n_edges:
        raise InputError(f"edge masks must be [C, {graph.n_edges}], got {arr.shape}")
    return arr, [f"mask:{int(m.sum())}" for m in arr], None


@sized_threads  # small calls on one thread, large ones on the cores (circuitstat.circuits.threads)
def faithfulness(
    model: CircuitModel,
    data: PairData,
    circuits: "Circuit | Sequence[Circuit] | np.ndarray",
    *,
    ablation: "str | Ablation" = "counterfactual",
    reference: PairData | None = None,
    seed: int = SEED.default,
    batch_size: int = BATCH_SIZE.default,
    max_rows: int = 64,
    rtol: float = 1e-4,
    atol: float = 1e-6,
    progress: bool = True,
    rows: "np.ndarray | None" = None,
) -> FaithfulnessResult:
    """Per-example faithfulness of one or more circuits (edges outside a circuit carry the counterfactual).

    ``rows``: evaluate only these examples (in this order; the ablation is still built on all of
    ``data``, so mean and resample ablations do not depend on which rows are evaluated).

    ``circuits``: a Circuit, a list of them, or boolean edge masks [E] / [C, E] (True = live).
    ``ablation``: an ablation name or an Ablation object (reuse one to compute means once).
    ``batch_size`` examples per batch; each batch runs its (example, circuit) rows ``max_rows``
    at a time (memory per chunk ≈ max_rows × senders × positions × d_model activations).
    ``rtol``/``atol`` decide when ``m(M) − m(∅)`` counts as zero (f undefined).
    """
    masks, labels, objs = _as_masks(circuits, model.graph)
    return _evaluate(model, data, masks, labels, objs, ablation=ablation, reference=reference, seed=seed,
                     batch_size=batch_size, max_rows=max_rows, rtol=rtol, atol=atol, progress=progress, rows=rows)


@torch.no_grad()
def _evaluate(model, data, masks, labels, objs, *, ablation, reference, seed, batch_size, max_rows, rtol, atol,
              progress, k=None, log_x=False, extra=None, sizes=None, n_total=None, rows=None) -> FaithfulnessResult:
    g = model.graph
    todo = np.arange(int(data.clean.shape[0])) if rows is None else np.asarray(rows, dtype=np.int64)
    if todo.size and (todo.min() < 0 or todo.max() >= data.clean.shape[0]):
        raise InputError(f"rows must index the {data.clean.shape[0]} examples")
    N = int(todo.size)
    if N == 0:
        raise InputError("the dataset is empty; give at least one example")
    if data.corrupted.shape != data.clean.shape:
        raise InputError(f"clean {tuple(data.clean.shape)} and corrupted {tuple(data.corrupted.shape)} ids differ in shape")
    if batch_size < 1 or max_rows < 1:
        raise InputError("batch_size and max_rows must be positive")
    C = masks.shape[0]
    t0 = time.perf_counter()
    abl = ablation if not isinstance(ablation, str) else Ablation(
        ablation, model, data, reference=reference, seed=seed, batch_size=batch_size)
    dev = model.device
    patch = torch.as_tensor(~masks, device=dev).to(model.dtype)  # 1 = edge carries the counterfactual
    all_senders = torch.ones(g.n_senders, device=dev, dtype=model.dtype)
    mdt = np.float64 if model.dtype == torch.float64 else np.float32  # float64 models: float64 metrics
    m_circuit = np.empty((N, C), dtype=mdt)
    m_clean = np.empty(N, dtype=mdt)
    m_empty = np.empty(N, dtype=mdt)
    for start in tqdm(range(0, N, batch_size), desc="faithfulness", disable=not progress, leave=False):
        index = torch.as_tensor(todo[start:start + batch_size])
        B = len(index)
        ids = data.clean[index].to(dev)
        am = data.attention_mask[index].to(dev)
        last = last_index(am)
        clean_last = model.run(ids, am, logits_at=last).logits
        m_clean[start:start + B] = data.score(clean_last, indices=index, clean_logits=clean_last).cpu().numpy()
        cf = abl.senders(index)
        # m(∅) by replacing every sender's output: the same run as an all-patched edge mask, another code path
        empty_last = model.run(ids, am, intervention=Intervention.nodes(all_senders, cf), logits_at=last).logits
        m_empty[start:start + B] = data.score(empty_last, indices=index, clean_logits=clean_last).cpu().numpy()
        rows = torch.arange(B * C, device=dev)
        for chunk in rows.split(max_rows):
            b, c = chunk // C, chunk % C
            cf_rows = cf[b] if cf.shape[0] > 1 else cf
            out = model.run(ids[b], am[b], intervention=Intervention.edges(patch[c], cf_rows), logits_at=last[b]).logits
            m = data.score(out, indices=index[b.cpu()], clean_logits=clean_last[b]).cpu().numpy()
            m_circuit[start + b.cpu().numpy(), c.cpu().numpy()] = m
    params = {"ablation": abl.kind, "metric": getattr(data, "metric_name", "metric"), "batch_size": batch_size,
              "max_rows": max_rows, "seed": seed, "rtol": rtol, "atol": atol,
              "reference": None if reference is None else getattr(reference, "content_hash", "given"),
              "task": getattr(data, "content_hash", None),
              "model": model.identity() if hasattr(model, "identity") else None,
              "circuits": [c.describe() for c in objs] if objs else None,
              "seconds": time.perf_counter() - t0, **(extra or {})}
    res = FaithfulnessResult(m_circuit=m_circuit, m_clean=m_clean, m_empty=m_empty,
                             n_edges=masks.sum(1) if sizes is None else sizes,
                             n_graph_edges=g.n_edges if n_total is None else n_total, labels=labels, params=params,
                             k=k, circuits=objs, log_x=log_x)
    if res.n_undefined:
        warnings.warn(f"faithfulness is undefined for {res.n_undefined} of {N} examples: the ablation leaves their "
                      f"metric unchanged (|m(M) - m(∅)| <= atol + rtol·scale); they are NaN in per_example and "
                      f"left out of mean_per_example (ratio_of_means uses all examples)", RuntimeWarning, stacklevel=3)
    if res.ratio_undefined:
        warnings.warn("the ratio-of-means faithfulness is undefined: mean m(M) ≈ mean m(∅)", RuntimeWarning, stacklevel=3)
    return res


@sized_threads
def faithfulness_curve(
    model: CircuitModel,
    data: PairData,
    scores: Any,
    *,
    ranking: str | None = None,
    fractions: Sequence[float] | None = MIB_FRACTIONS,
    ks: Sequence[int] | None = None,
    rule: str = "top_k",
    prune: bool = True,
    log_x: bool = False,
    ablation: "str | Ablation" = "counterfactual",
    reference: PairData | None = None,
    seed: int = SEED.default,
    batch_size: int = BATCH_SIZE.default,
    max_rows: int = 64,
    rtol: float = 1e-4,
    atol: float = 1e-6,
    progress: bool = True,
    level: str = "edge",
    tie_seed: Any = 0,
    **renamed: Any,
) -> FaithfulnessResult:
    """Faithfulness over a grid of circuit sizes from one score vector, with MIB's CPR and CMD.

    ``level="node"``: ``scores`` are per sender (node scores [U] or a node ScoreMatrix) and each
    circuit is the top-k nodes: every out-edge of a node outside it carries the counterfactual,
    i.e. the node is ablated everywhere (``rule`` and ``prune`` do not apply; sizes and the x
    axis count nodes).

    ``scores``: a ScoreMatrix (its mean is ranked) or a vector [E].  The grid is ``ks`` (edge
    counts) or ``fractions`` of all edges (k = ⌊fraction · E⌋, MIB's default grid).  ``rule`` is
    ``"top_k"`` or ``"greedy"``; ``prune`` (default True, as MIB) prunes each circuit before it
    is evaluated (CPR and CMD still integrate over the nominal sizes, as MIB).  ``tie_seed`` breaks ties at each cut-off (the one
    top-k, circuitstat.core.topk; the same seed gives nested circuits). The remaining keywords are :func:`faithfulness`'s.
    """
    from .scores import ScoreMatrix

    ranking = check_ranking(ranking, renamed, "faithfulness_curve")
    if level == "node":
        return _node_curve(model, data, scores, ranking=ranking, tie_seed=tie_seed, fractions=fractions, ks=ks, log_x=log_x,
                           ablation=ablation, reference=reference, seed=seed, batch_size=batch_size,
                           max_rows=max_rows, rtol=rtol, atol=atol, progress=progress)
    if level != "edge":
        raise InputError(f"unknown level {level!r}; use edge or node")
    if rule not in ("top_k", "greedy"):
        raise InputError(f"unknown rule {rule!r}; use 'top_k' or 'greedy'")
    graph = scores.graph if isinstance(scores, ScoreMatrix) else model.graph
    ks, used_fractions = _size_grid(ks, fractions, graph.n_edges, "edge")
    if sorted(ks) != ks:
        raise InputError(f"circuit sizes must be non-decreasing, got {ks}")
    build = Circuit.top_k if rule == "top_k" else Circuit.greedy
    circuits = []
    for k in ks:
        c = build(scores, k, ranking=ranking, seed=tie_seed, graph=graph)
        circuits.append(c.prune() if prune else c)
    extra = {"curve": {"rule": rule, "ranking": ranking, "prune": prune, "ks": ks, "log_x": log_x,
                       "fractions": used_fractions,
                       "x": "nominal: the requested fraction of all edges (k / E for counts), as MIB",
                       "integration": "trapezoid on the grid (MIB)"}}
    masks, labels, objs = _as_masks(circuits, model.graph)
    labels = [f"k={k}" for k in ks]
    return _evaluate(model, data, masks, labels, objs, ablation=ablation, reference=reference, seed=seed,
                     batch_size=batch_size, max_rows=max_rows, rtol=rtol, atol=atol, progress=progress,
                     k=np.asarray(ks), log_x=log_x, extra=extra)


def _size_grid(ks: Sequence[int] | None, fractions: Sequence[float] | None, n: int,
               what: str) -> tuple[list[int], list[float] | None]:
    """(circuit sizes, the fractions they came from or None): ``ks`` as ints, or int(f * n) per fraction (MIB)."""
    if ks is not None:
        return [int(k) for k in ks], None
    if not fractions:
        raise InputError(f"give ks ({what} counts) or fractions of all {what}s")
    fr = np.asarray(fractions, dtype=np.float64)
    if np.any((fr < 0) | (fr > 1)):
        raise InputError("fractions must lie in [0, 1]")
    return [int(f * n) for f in fr], fr.tolist()


def _node_curve(model: CircuitModel, data: PairData, scores: Any, *, ranking: str, tie_seed: Any,
                fractions: Sequence[float] | None, ks: Sequence[int] | None, log_x: bool,
                **evaluate) -> FaithfulnessResult:
    """Faithfulness of top-k node circuits (see :func:`faithfulness_curve`, ``level="node"``)."""
    from .scores import ScoreMatrix

    g = model.graph
    U = g.n_senders
    vec = scores.mean() if isinstance(scores, ScoreMatrix) else np.asarray(scores, dtype=np.float64)
    if vec.shape != (U,):
        raise InputError(f"node scores must have one value per sender ({U}), got shape {vec.shape}")
    ks, used_fractions = _size_grid(ks, fractions, U, "node")
    if sorted(ks) != ks or (ks and (ks[0] < 0 or ks[-1] > U)):
        raise InputError(f"node circuit sizes must be non-decreasing within 0..{U}, got {ks}")
    ss = as_seed_sequence(tie_seed)
    live = np.zeros((len(ks), U), dtype=bool)
    ties, excluded = [], []
    for i, k in enumerate(ks):  # the one top-k (circuitstat.core.topk); one seed, so the circuits are nested
        t = topk(vec, k, ranking=ranking, seed=ss) if k else None
        if t is not None:
            live[i, t.indices] = True
        ties.append(0 if t is None else int(t.n_tied_at_cutoff))
        excluded.append(0 if t is None else int(t.n_tied_excluded))
    masks = live[:, np.asarray(g.edge_sender)]  # an edge is live iff its sender is in the circuit
    extra = {"curve": {"level": "node", "rule": "top_k", "ranking": ranking, "prune": False, "ks": ks,
                       "log_x": log_x, "fractions": used_fractions, "x": "nodes in the circuit / all nodes",
                       "integration": "trapezoid on the grid (MIB)", "ties": TIE_RULE, "tie_seed": seed_record(ss),
                       "cutoff_ties": ties, "cutoff_ties_excluded": excluded},
             "nodes": [[g.senders[u] for u in np.flatnonzero(row)] for row in live]}
    return _evaluate(model, data, masks, [f"k={k}" for k in ks], None, k=np.asarray(ks), log_x=log_x, extra=extra,
                     sizes=np.asarray(ks, dtype=np.int64), n_total=U, **evaluate)
