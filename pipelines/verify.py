"""Verified runs (docs/verified.md): exact patching on a random subset checks each approximate method.

Phase 1 is an approximate method's scores on all N prompts (the audit's or attribute's scores stage);
phase 2 is exact patching (circuitstat.circuits.verify.exact_subset) on ``n`` prompts drawn uniformly without
replacement from a recorded seed, on every edge or on the top-m candidates by |approximate mean| plus a
uniformly random r of the other edges. The statistics (PPI++ intervals, the missed-edges bound) are
circuitstat.stats.verified's; this module only draws the subsets, runs exact on them and writes the tables.

The active design (``verify: {design: active, budget: B}``; :func:`active_tables`) draws (prompt, edge) cells
instead: per approximate method, probabilities from its scores (circuitstat.stats.verified.active) and a Poisson
sample from the recorded seed; exact runs on the union of the methods' cells only
(circuitstat.circuits.verify.exact_cells), and each method's verified table is active_verified_means on its cells.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["VerifyPlan", "draw_seed", "draw_rows", "choose_edges", "verify_plan", "verified_tables",
           "MISSED_SPLIT", "pseudo_table", "verified_method", "read_pseudo", "active_draw", "active_tables",
           "exact_on_cells", "combined_method", "combined_tables"]

MISSED_SPLIT = 0.5
"""Share of the missed-edges bound's error rate spent on the hypergeometric bound; the rest goes to classifying
the sampled edges (TOST with Holm over them), so the bound holds at the run's confidence level."""


@dataclass(frozen=True)
class VerifyPlan:
    """Which prompts and edges phase 2 patches exactly: ``rows`` (sorted), and per method its top and random edges."""

    seed: int
    rows: np.ndarray
    top: dict[str, np.ndarray]
    random: dict[str, np.ndarray]
    all_edges: bool

    def edges(self) -> np.ndarray | None:
        """Return the union of every method's verified edges (sorted), or None for all edges."""
        if self.all_edges:
            return None
        return np.unique(np.concatenate([*self.top.values(), *self.random.values()]))


def draw_seed(seed: int | None, stage_seed: np.random.SeedSequence) -> int:
    """Return the seed the subsets are drawn from: the spec's, else one derived from the run's stage seed."""
    return int(seed) if seed is not None else int(stage_seed.generate_state(1, np.uint64)[0] >> np.uint64(1))


def draw_rows(N: int, n: int, seed: int) -> np.ndarray:
    """Return ``n`` of ``N`` prompt indices drawn uniformly without replacement from ``seed``, sorted."""
    return np.sort(np.random.default_rng(seed).choice(N, size=n, replace=False)).astype(np.int64)


def choose_edges(approx_mean: np.ndarray, top: int, random: int, rng: np.random.Generator
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Return (the ``top`` edges by |mean| (the one top-k, ties at random from ``rng``), a uniform sample of
    ``random`` of the other edges)."""
    from circuitstat.core.topk import topk

    E = approx_mean.size
    head = np.sort(topk(approx_mean, top, ranking="absolute", seed=rng).indices) if top else np.zeros(0, np.int64)
    rest = np.setdiff1d(np.arange(E), head)
    return head.astype(np.int64), np.sort(rng.choice(rest, size=min(random, rest.size), replace=False)).astype(np.int64)


def verify_plan(approx: dict[str, np.ndarray], verify, seed: int) -> VerifyPlan:
    """Return the VerifyPlan of a ``verify`` spec over the methods' [N, E] scores ``approx``, drawn from ``seed``."""
    N = next(iter(approx.values())).shape[0]
    rows = draw_rows(N, verify.n, seed)
    top: dict[str, np.ndarray] = {}
    rand: dict[str, np.ndarray] = {}
    if verify.edges is not None:
        # one independent stream per method, spawned after the rows' draw: adding a method changes no other's edges
        for i, (m, S) in enumerate(approx.items()):
            rng = np.random.default_rng([seed, i + 1])
            top[m], rand[m] = choose_edges(S.mean(0), verify.edges.top, verify.edges.random, rng)
    return VerifyPlan(seed, rows, top, rand, verify.edges is None)


def _with_method(table, method: str):
    """Return ``table`` with a leading ``method`` column."""
    import pyarrow as pa

    return table.add_column(0, "method", pa.array([method] * table.num_rows, pa.string()))


def _method_tables(S: np.ndarray, exact: np.ndarray, cols: np.ndarray, plan: VerifyPlan, method: str, names,
                   level: float, tau: float | None, correction: str = "bh"):
    """Return (the verified table, the missed_edges table or None) of one method from its scores ``S`` [N, E]
    and exact on ``plan.rows`` for the edges ``cols`` (``exact`` [n, len(cols)])."""
    import pyarrow as pa

    from circuitstat.stats.verified import missed_edges_bound, verified_means
    from circuitstat.stats.verified.missed import tost_holm_possibly_above
    from circuitstat.stats.verified.missed_mass import missed_mass_bound, sampled_effects

    mine = np.arange(S.shape[1]) if plan.all_edges else np.union1d(plan.top[method], plan.random[method])
    at = np.searchsorted(cols, mine)
    res = verified_means(S[:, mine], exact[:, at], plan.rows, confidence_level=level, correction=correction,
                         edge_names=[names[e] for e in mine])
    table = _with_method(res.to_table("verified"), method)
    table = table.set_column(table.schema.get_field_index("edge"), "edge", pa.array(mine, pa.int64()))
    if plan.all_edges:
        return table, None
    sample = plan.random[method]
    alpha = 1.0 - level
    at_r = np.searchsorted(cols, sample)
    # the sampled edges classified below τ with family-wise error α·(1 − split): TOST p-values, Holm over the r edges
    cls = verified_means(S[:, sample], exact[:, at_r], plan.rows)
    above = tost_holm_possibly_above(cls.estimate, cls.standard_error, cls.df, tau, alpha * (1 - MISSED_SPLIT))
    # the missed mass (Σ|μ| over the unverified edges) at the run's level on its own: the sample post-stratified
    # by the approximation's |mean| rank among the edges outside the top (circuitstat.stats.verified.missed_mass);
    # one sampled edge has no spread to read (verify.edges.random: 1), so its table has no mass columns, the
    # verdict says nothing of the mass, and every method of the run is alike (they share top and random)
    rest = np.setdiff1d(np.arange(S.shape[1]), plan.top[method])
    mass = missed_mass_bound(*sampled_effects(S[:, sample], exact[:, at_r], plan.rows), np.searchsorted(rest, sample),
                             S[:, rest].mean(0), confidence_level=level) if sample.size >= 2 else None
    bound = missed_edges_bound(np.asarray(above, bool), rest.size, tau=tau,
                               n_top=plan.top[method].size, confidence_level=1.0 - alpha * MISSED_SPLIT,
                               classification_level=1.0 - alpha * (1 - MISSED_SPLIT), mass=mass)
    return table, _with_method(bound.to_table("missed_edges"), method)


def verified_tables(approx: dict[str, np.ndarray], exact: np.ndarray, cols: np.ndarray, plan: VerifyPlan, names,
                    *, confidence_level: float, tau: float | None, correction: str = "bh",
                    combine: list[str] | None = None) -> dict:
    """Return {verified, verified_prompts[, missed_edges | verified_pseudo][, verified_coefficients]} tables over
    every approximate method in ``approx``; with ``combine``, also the rows of those methods together as control
    variates (:func:`combined_tables`), after the single methods' rows."""
    import pyarrow as pa

    parts = [_method_tables(S, exact, cols, plan, m, names, confidence_level, tau, correction)
             for m, S in approx.items()]
    extra = {}
    if combine is not None:
        table, extra["verified_coefficients"] = combined_tables(
            approx, exact, cols, plan, combine, names, confidence_level=confidence_level, correction=correction)
        parts.append((table, None))
    N = next(iter(approx.values())).shape[0]
    out = {"verified": pa.concat_tables([p[0] for p in parts]), **extra,
           "verified_prompts": pa.table({"row": pa.array(plan.rows, pa.int64()),
                                         "seed": pa.array([plan.seed] * plan.rows.size, pa.int64()),
                                         "n_prompts": pa.array([N] * plan.rows.size, pa.int64())})}
    if not plan.all_edges:
        out["missed_edges"] = pa.concat_tables([p[1] for p in parts])
    else:  # every edge verified: circuits can be selected from the estimates (pseudo_scores)
        out["verified_pseudo"] = pa.concat_tables([pseudo_table(S, exact, plan.rows, m) for m, S in approx.items()])
    return out


def combined_method(methods: list[str]) -> str:
    """Return the method name of ``methods`` verified together as control variates, e.g. "eap+atp-qkfix".

    No method name holds a "+", and a combination's members are methods, never "verified", so the name can be
    neither a method's nor a circuit name of :func:`verified_method` ("<method>+verified")."""
    return "+".join(methods)


def combined_tables(approx: dict[str, np.ndarray], exact: np.ndarray, cols: np.ndarray, plan: VerifyPlan,
                    combine: list[str], names, *, confidence_level: float, correction: str = "bh"):
    """Return (the verified rows, the verified_coefficients rows) of the methods ``combine`` together: the scores
    ``approx[m]`` [N, E] as control variates (circuitstat.stats.verified.verified_means_multi, its defaults) on the
    same verified prompts and exact cells as the single methods; method column :func:`combined_method`."""
    from circuitstat.core.errors import InputError
    from circuitstat.stats.verified import verified_means_multi

    if not plan.all_edges:  # VerifySpec refuses it first; a library caller gets the same words
        raise InputError("verify.combine verifies every edge; remove verify.edges (and tau) or combine")
    E = next(iter(approx.values())).shape[1]
    res = verified_means_multi({m: approx[m] for m in combine}, exact[:, np.searchsorted(cols, np.arange(E))],
                               plan.rows, confidence_level=confidence_level, correction=correction,
                               edge_names=list(names))
    name = combined_method(combine)  # every edge, in order: the result's edge column is the graph's edge index
    return _with_method(res.to_table("verified"), name), _with_method(res.to_table("verified_coefficients"), name)


def pseudo_table(S: np.ndarray, exact: np.ndarray, rows: np.ndarray, method: str):
    """Return the verified_pseudo rows of ``method``: its pseudo-scores (column means = its verified estimates)."""
    import pyarrow as pa

    from circuitstat.core.tables import matrix_to_table
    from circuitstat.stats.verified import verified_pseudo_scores

    ps = verified_pseudo_scores(S, exact, rows)
    N = S.shape[0]
    return matrix_to_table(ps.scores, {"method": pa.array([method] * N, pa.string()),
                                       "example": pa.array(np.arange(N), pa.int64()),
                                       "labelled": pa.array(ps.strata == 1, pa.bool_())})


def verified_method(method: str) -> str:
    """Return the name a circuit analysis gives circuits selected from ``method``'s verified estimates."""
    return f"{method}+verified"


def read_pseudo(table, method: str) -> tuple[np.ndarray, np.ndarray]:
    """Return (pseudo-scores [N, E] float64, strata [N]: 1 = labelled) of ``method`` from a verified_pseudo table."""
    import pyarrow.compute as pc

    from circuitstat.core.tables import table_to_matrix

    mine = table.filter(pc.equal(table.column("method"), method)).sort_by("example")
    return (np.asarray(table_to_matrix(mine), np.float64),
            np.asarray(mine.column("labelled").to_numpy(zero_copy_only=False), np.int64))


def run_exact(model, task, plan: VerifyPlan, **options):
    """Return (exact [n, |edges|], the edge indices) on ``plan``'s prompts and edges (circuits.verify.exact_subset)."""
    from circuitstat.circuits.verify import exact_subset

    sub = exact_subset(model, task, rows=plan.rows, edges=plan.edges(), **options)
    return np.asarray(sub.scores, np.float64), sub.edges


def active_draw(approx: dict[str, np.ndarray], budget: float, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Return {method: (π [N, E], sampled cells [N, E] bool)}: the i-th method's cells drawn from
    numpy.random.SeedSequence([seed, i]) (one stream per method: adding a method changes no other's cells)."""
    from circuitstat.stats.verified.active import active_probabilities, active_sample

    out = {}
    for i, (m, S) in enumerate(approx.items()):
        p = active_probabilities(S, budget)
        out[m] = (p, active_sample(p, np.random.SeedSequence([seed, i])))
    return out


def exact_on_cells(model, task, cells: np.ndarray, **options) -> np.ndarray:
    """Return exact [N, E] float64 on ``cells`` (NaN elsewhere): circuits.verify.exact_cells, suffix rows for them only."""
    from circuitstat.circuits.verify import exact_cells

    return np.asarray(exact_cells(model, task, cells, **options).scores, np.float64)


def active_tables(approx: dict[str, np.ndarray], exact, budget: float, seed: int, names, *,
                  confidence_level: float, correction: str = "bh") -> dict:
    """Return {verified, verified_cells} of the active design: cells drawn per method (:func:`active_draw`), exact on
    their union from ``exact(cells [N, E] bool) -> [N, E]`` (NaN outside the cells is fine), and per method
    circuitstat.stats.verified.active_verified_means on its own cells."""
    import pyarrow as pa

    from circuitstat.stats.verified.active_result import active_verified_means

    draws = active_draw(approx, budget, seed)
    union = np.logical_or.reduce([c for _, c in draws.values()])
    Y = exact(union)
    verified, cells = [], []
    for i, (m, (p, c)) in enumerate(draws.items()):
        res = active_verified_means(approx[m], np.where(c, Y, np.nan), c, p, budget=budget,
                                    confidence_level=confidence_level, correction=correction,
                                    edge_names=list(names))
        verified.append(_with_method(res.to_table("verified"), m))
        row, edge = np.nonzero(c)
        k = row.size
        cells.append(pa.table({"method": pa.array([m] * k, pa.string()), "row": pa.array(row, pa.int64()),
                               "edge": pa.array(edge, pa.int64()), "probability": pa.array(p[row, edge], pa.float64()),
                               "seed": pa.array([seed] * k, pa.int64()), "stream": pa.array([i] * k, pa.int64()),
                               "budget": pa.array([float(budget)] * k, pa.float64()),
                               "n_prompts": pa.array([p.shape[0]] * k, pa.int64())}))
    return {"verified": pa.concat_tables(verified), "verified_cells": pa.concat_tables(cells)}


def phase2_flops(cfg, spec, verify, *, n_methods: int) -> float:
    """The expected FLOPs of ``verify``'s phase 2 on a model of config ``cfg`` (circuits.plan.verify_cost): the
    methods share the prompts; with an edge subset each method adds its own top and random edges (at most)."""
    from circuitstat.circuits.plan import verify_cost
    from circuitstat.pipelines.build import task_positions

    task = spec.task if not isinstance(spec.task, str) else None
    name, options = (task.name, task.options) if task is not None else (spec.task, getattr(spec, "task_options", {}))
    positions = task_positions(name, options or {}) or min(int(cfg.n_ctx), 64)
    N = task.n if task is not None else spec.n
    if verify.design == "active":
        return active_phase2_cost(cfg, verify.budget, N=N, positions=positions, n_methods=n_methods,
                                  batch_size=spec.batch_size)[0].flops
    k = None if verify.edges is None else n_methods * (verify.edges.top + verify.edges.random)
    return verify_cost(cfg, n=verify.n, N=N, positions=positions, n_edges=k, batch_size=spec.batch_size).flops


def active_phase2_cost(cfg, budget: float, *, N: int, positions: int, n_methods: int, **sizes):
    """Return (the expected Cost of the active design's phase 2, (lower, upper) bounds on its forwarded examples):
    circuits.plan.active_verify_cost with the design's defensive mixture (stats.verified.active.ACTIVE_MIX)."""
    from circuitstat.circuits.plan import active_verify_cost
    from circuitstat.stats.verified.active import ACTIVE_MIX

    return active_verify_cost(cfg, budget=budget, N=N, positions=positions, mix=ACTIVE_MIX, streams=n_methods, **sizes)


def verify_from_options(n: int | None, edges: str | None, tau: float | None, seed: int | None,
                        design: str | None = None, budget: float | None = None, correction: str | None = None):
    """Return the VerifySpec of ``attribute``'s --verify N, --verify-edges TOP,RANDOM, --verify-tau, --verify-seed,
    --verify-design, --verify-budget and --verify-correction (None without --verify or --verify-design active);
    InputError naming the flag otherwise."""
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.spec import VerifySpec, validate_spec

    if design == "active" or budget is not None:
        return active_from_options(n, edges, tau, seed, design, budget, correction)
    if n is None:
        if design is not None:
            raise InputError("--verify-design uniform needs --verify N (the prompts to patch exactly)")
        if edges is not None or tau is not None or seed is not None or correction is not None:
            raise InputError("--verify-edges, --verify-tau, --verify-seed and --verify-correction need --verify N (the "
                             "prompts to patch exactly)")
        return None
    doc: dict = {"n": n, "seed": seed, "tau": tau, "correction": correction}
    if edges is not None:
        parts = edges.split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise InputError(f"--verify-edges must be TOP,RANDOM (two whole numbers, e.g. 50,200), got {edges!r}")
        doc["edges"] = {"top": int(parts[0]), "random": int(parts[1])}
    spec = validate_spec(VerifySpec, {k: v for k, v in doc.items() if v is not None}, "--verify", kind="option")
    return spec


def active_from_options(n: int | None, edges: str | None, tau: float | None, seed: int | None, design: str | None,
                        budget: float | None, correction: str | None = None):
    """Return the active design's VerifySpec of attribute's flags; InputError naming the flag that does not fit."""
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.spec import VerifySpec, validate_spec

    if design != "active":
        raise InputError("--verify-budget is the active design's expected exact cells per edge; add "
                         "--verify-design active or remove --verify-budget")
    if budget is None:
        raise InputError("--verify-design active needs --verify-budget B: the expected exact (prompt, edge) cells per "
                         "edge (e.g. 51 for a tenth of 512 prompts)")
    if n is not None or edges is not None or tau is not None:
        raise InputError("--verify N, --verify-edges and --verify-tau are the uniform design's; --verify-design active "
                         "spends --verify-budget cells on every edge instead: remove them")
    doc = {"design": "active", "budget": budget, **({"seed": seed} if seed is not None else {}),
           **({"correction": correction} if correction is not None else {})}
    return validate_spec(VerifySpec, doc, "--verify", kind="option")
