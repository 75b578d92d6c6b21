"""Hypothesis tests of a circuit on per-prompt metric arrays: equivalence, independence, minimality,
sufficiency and partial necessity.

After Shi, Beltran-Velez, Nazaret, Zheng, Garriga-Alonso, Jesson, Makar & Blei, "Hypothesis Testing the
Circuit Hypothesis in LLMs" (NeurIPS 2024; code github.com/blei-lab/circuitry, circuitry/hypothesis_testing/).
Where this module departs from that code it says so:

- equivalence uses the proportion statistic the paper's docstring defines, P̂(Δ > 0) with
  Δ = s(C(x)) − s(M(x)), not the mean score difference ``non_equivalence.py`` passes to its p-value;
- the minimality test's per-edge family is adjusted (Holm by default, BH on request); the reference
  code leaves that correction out (a comment there says it is still to be added);
- the HSIC bandwidth is the median heuristic per variable (Gretton et al. 2007), not the median of the
  cross distances between the two variables, and the permutation p-value counts the observed statistic
  ((1 + #{null ≥ observed}) / (B + 1)), so it is never 0;
- sufficiency and partial necessity count ties against the circuit (conservative); their default is the
  paper's binomial test against the fixed quantile q = 0.9, reported with Ĝ (the share of random circuits
  beaten) and its Clopper-Pearson interval; ``quantile=None`` gives the exact rank p-value among random
  circuits of its size (an exchangeability null) instead;
- the equivalence test is also run as a TOST (two one-sided binomial tests, Schuirmann 1987), whose null is
  non-equivalence, so that "equivalent" can be affirmed; both report P̂(Δ > 0) with its Clopper-Pearson interval;
- losses that are equal in exact arithmetic (two circuits that compute the same function, evaluated in
  different batches) differ by float rounding; comparisons of losses treat root-mean-square losses within
  ``FLOAT_RTOL`` times the metric's magnitude as ties, instead of letting rounding noise order them.

Every input is an array of per-prompt metric values (one model evaluation per prompt); nothing here
runs a model. The faithfulness loss between two evaluations is the reference code's
``BaseTask.eval_metric`` default: the mean over prompts of the squared difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from circuitstat.core.errors import InputError
from circuitstat.stats.testing import bh_adjust, holm_adjust

__all__ = ["CircuitTestResult", "MinimalityResult", "faithfulness_loss", "equivalence_pvalue", "equivalence_test",
           "tost_pvalue", "equivalence_tost", "clopper_pearson", "float_tolerance", "hsic_statistic",
           "independence_test", "minimality_from_effects", "minimality_test", "sufficiency_test",
           "partial_necessity_test", "versus_random", "CORRECTIONS", "PAPER_QUANTILE", "FLOAT_RTOL"]

#: multiplicity corrections of the minimality family: Holm (family-wise, any dependence) or BH (FDR)
CORRECTIONS = ("holm", "bh")
#: the fixed quantile of the paper's sufficiency / partial necessity / minimality tests (Shi et al. 2024)
PAPER_QUANTILE = 0.9
#: rounding tolerance of loss comparisons, relative to the metric's magnitude: 128 float32 ulps. The metrics come
#: from float32 forwards, so two circuits that compute the same function differ by a few ulps of the metric
#: (measured: ~1e-6 on metrics of order 1, re-batched); their RMS losses differ by no more.
FLOAT_RTOL = 128 * float(np.finfo(np.float32).eps)
#: level of the Clopper-Pearson intervals of P̂(Δ > 0), Ĝ and the minimality shares reported beside the tests
CI_LEVEL = 0.95


@dataclass(frozen=True)
class CircuitTestResult:
    """One test of a circuit (scipy style): ``statistic``, ``pvalue``, the null it tests and what a rejection means."""

    test: str
    statistic: float
    pvalue: float
    null: str
    rejection_means: str
    n: int
    details: dict = field(default_factory=dict)

    def reject(self, alpha: float = 0.05) -> bool:
        """Return whether the null is rejected at level ``alpha``."""
        return bool(self.pvalue <= alpha)


@dataclass(frozen=True)
class MinimalityResult:
    """Per-edge minimality tests as one family: counts, raw and adjusted p-values and decisions at ``alpha``."""

    statistic: np.ndarray
    pvalue: np.ndarray
    pvalue_adjusted: np.ndarray
    reject: np.ndarray
    edge_effect: np.ndarray
    reference_effect: np.ndarray
    quantile: float
    alpha: float
    correction: str
    null: str = ("edge e is needed: its knockout effect exceeds that of a random edge of a random input -> logits "
                 "path added to the circuit, with probability >= quantile")
    rejection_means: str = "edge e is redundant (the circuit is not minimal)"

    @property
    def minimal(self) -> bool:
        """True when no edge's null is rejected after the multiplicity correction."""
        return not bool(self.reject.any())

    @property
    def pvalue_min(self) -> float:
        """The smallest adjusted p-value (the family's evidence against minimality)."""
        return float(np.min(self.pvalue_adjusted)) if self.pvalue_adjusted.size else 1.0


def _vector(x: Any, name: str) -> np.ndarray:
    """Return ``x`` as a finite float64 vector or raise InputError naming it."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.size < 2:
        raise InputError(f"{name} must be a 1-D array of per-prompt metric values with >= 2 prompts, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise InputError(f"{name} has NaN or infinite metric values; drop those prompts before testing")
    return a


def _matrix(x: Any, n: int, name: str) -> np.ndarray:
    """Return ``x`` as a finite float64 [n, R] matrix (R >= 1) or raise InputError naming it."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.shape[0] != n or a.shape[1] < 1:
        raise InputError(f"{name} must be [prompts={n}, circuits >= 1], got shape {a.shape}")
    if not np.isfinite(a).all():
        raise InputError(f"{name} has NaN or infinite metric values; drop those prompts before testing")
    return a


def clopper_pearson(k: int, n: int, level: float = CI_LEVEL) -> tuple[float, float]:
    """Return the exact (Clopper-Pearson) interval of a binomial proportion k / n (scipy's binomtest)."""
    if n < 1:
        return float("nan"), float("nan")
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


def float_tolerance(*arrays: Any) -> float:
    """Return the RMS-loss tie tolerance for metrics ``arrays``: FLOAT_RTOL times their largest magnitude."""
    scale = max((float(np.max(np.abs(a))) for a in arrays if np.size(a)), default=0.0)
    return FLOAT_RTOL * scale


def _exceeds(a: np.ndarray, b: np.ndarray, tol: float) -> np.ndarray:
    """Return a > b for losses (>= 0), where RMS losses within ``tol`` of each other count as ties (False)."""
    return (a > b) & (np.sqrt(np.maximum(a, 0)) - np.sqrt(np.maximum(b, 0)) > tol)


def faithfulness_loss(reference: Any, candidate: Any) -> np.ndarray:
    """Return the mean over prompts (axis 0) of (candidate − reference)², per column of ``candidate``."""
    ref = np.asarray(reference, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    if cand.ndim == 2:
        ref = ref[:, None]
    return ((cand - ref) ** 2).mean(axis=0)


# ---- equivalence -----------------------------------------------------------------------------------

def equivalence_pvalue(k: int, n: int, margin: float) -> float:
    """Return P(|2K − n| >= |2k − n|) for K ~ Binomial(n, 1/2 + margin): the p-value of the null |p − 1/2| <= margin.

    The tail probability grows with |p − 1/2|, so the supremum over the null is at its boundary, and both
    boundaries give the same value by symmetry (the reference code's ``_compute_pval``, here with integer
    arithmetic instead of a float comparison of k/n).
    """
    if n < 1 or not 0 <= k <= n:
        raise InputError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if not 0 <= margin < 0.5:
        raise InputError(f"margin must lie in [0, 0.5), got {margin}")
    d = abs(2 * int(k) - int(n))
    if d == 0:
        return 1.0
    hi, lo = (n + d) // 2, (n - d) // 2
    p0 = 0.5 + margin
    return float(min(1.0, stats.binom.sf(hi - 1, n, p0) + stats.binom.cdf(lo, n, p0)))


def tost_pvalue(k: int, n: int, margin: float) -> float:
    """Return the TOST p-value of H0 |p − 1/2| >= margin from k of n: max(P(K >= k | 1/2 − margin), P(K <= k | 1/2 + margin)).

    Two one-sided exact binomial tests (Schuirmann 1987); rejecting both affirms |p − 1/2| < margin. Its rejection
    region is the Clopper-Pearson (1 − 2α) interval lying inside (1/2 − margin, 1/2 + margin).
    """
    if n < 1 or not 0 <= k <= n:
        raise InputError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if not 0 <= margin < 0.5:
        raise InputError(f"margin must lie in [0, 0.5), got {margin}")
    low = stats.binom.sf(int(k) - 1, n, 0.5 - margin)  # H0: p <= 1/2 - margin, reject for large k
    high = stats.binom.cdf(int(k), n, 0.5 + margin)  # H0: p >= 1/2 + margin, reject for small k
    return float(min(1.0, max(low, high)))


def _proportion(full: Any, circuit: Any, ties: str, random_state: Any) -> tuple[int, int, dict]:
    """Return (k, n, details): prompts where the circuit scores above the model, ties split or dropped."""
    full, circuit = _vector(full, "full"), _vector(circuit, "circuit")
    if full.shape != circuit.shape:
        raise InputError(f"full {full.shape} and circuit {circuit.shape} must hold the same prompts")
    if ties not in ("random", "drop"):
        raise InputError(f"ties must be 'random' or 'drop', got {ties!r}")
    delta = circuit - full
    n_greater, n_ties = int((delta > 0).sum()), int((delta == 0).sum())
    if ties == "random":
        k, n = n_greater + int(np.random.default_rng(random_state).binomial(n_ties, 0.5)), delta.size
    else:
        k, n = n_greater, delta.size - n_ties
    low, high = clopper_pearson(k, n)
    return k, n, {"k": k, "n_used": n, "n_greater": n_greater, "n_ties": n_ties, "ties": ties,
                  "mean_difference": float(delta.mean()), "p_hat": k / n if n else float("nan"),
                  "ci_low": low, "ci_high": high, "ci_level": CI_LEVEL}


def equivalence_test(full: Any, circuit: Any, *, margin: float = 0.1, ties: str = "random",
                     random_state: Any = None) -> CircuitTestResult:
    """Return the test of H0 |P(s(C) > s(M)) − 1/2| <= margin (circuit and model alike); rejecting means not equivalent.

    ``full``/``circuit``: per-prompt metric of the full model and the circuit on the same prompts. The
    statistic is the proportion of prompts on which the circuit scores higher. ``ties`` (Δ = 0 exactly,
    e.g. a circuit that reproduces the model): "random" splits each tie by a fair coin (seeded by
    ``random_state``), so the count stays Binomial(n, P(Δ > 0) + P(Δ = 0)/2); "drop" leaves them out and
    tests the conditional proportion (all ties: p-value 1).
    """
    k, n, details = _proportion(full, circuit, ties, random_state)
    p = 1.0 if n == 0 else equivalence_pvalue(k, n, margin)
    return CircuitTestResult(
        "equivalence", k / n if n else 0.5, p, f"|P(circuit > model) - 1/2| <= {margin:g}",
        "the circuit and the model are not equivalent", int(np.size(full)), {**details, "margin": margin})


def equivalence_tost(full: Any, circuit: Any, *, margin: float = 0.1, ties: str = "random",
                     random_state: Any = None) -> CircuitTestResult:
    """Return the TOST of H0 |P(s(C) > s(M)) − 1/2| >= margin; rejecting affirms that circuit and model are equivalent.

    The paper's direction (:func:`equivalence_test`) cannot affirm equivalence: at low power it passes. This is
    the same proportion (ties handled alike; the same ``random_state`` splits them identically) with the null
    and the alternative swapped.
    """
    k, n, details = _proportion(full, circuit, ties, random_state)
    p = 1.0 if n == 0 else tost_pvalue(k, n, margin)
    return CircuitTestResult(
        "equivalence_tost", k / n if n else 0.5, p, f"|P(circuit > model) - 1/2| >= {margin:g} (not equivalent)",
        "the circuit and the model are equivalent (TOST)", int(np.size(full)), {**details, "margin": margin})


# ---- independence (HSIC) ---------------------------------------------------------------------------

def _centred_gram(x: np.ndarray) -> tuple[np.ndarray | None, float]:
    """Return (H K H, bandwidth) of the Gaussian kernel with the median-heuristic bandwidth (None when x is constant)."""
    dist = np.abs(x[:, None] - x[None, :])
    upper = dist[np.triu_indices(x.size, 1)]
    nonzero = upper[upper > 0]
    if nonzero.size == 0:
        return None, 0.0
    sigma = float(np.median(nonzero))
    K = np.exp(-dist ** 2 / (2.0 * sigma ** 2))
    K = K - K.mean(axis=0, keepdims=True)
    return K - K.mean(axis=1, keepdims=True), sigma


def hsic_statistic(x: Any, y: Any) -> float:
    """Return the biased HSIC trace(HKH HLH) / (n − 1)² with Gaussian kernels and median-heuristic bandwidths."""
    x, y = _vector(x, "x"), _vector(y, "y")
    Kc, _ = _centred_gram(x)
    Lc, _ = _centred_gram(y)
    if Kc is None or Lc is None:
        return 0.0
    return float((Kc * Lc).sum() / (x.size - 1) ** 2)


def independence_test(full: Any, complement: Any, *, n_permutations: int = 1000,
                      random_state: Any = None) -> CircuitTestResult:
    """Return the HSIC permutation test of H0: the complement's per-prompt metric is independent of the model's.

    Rejecting means the complement still carries task information (the circuit fails independence).
    The null distribution permutes ``complement`` against ``full``: permutation b uses the b-th
    ``rng.permutation(n)`` of ``numpy.random.default_rng(random_state)``; p = (1 + #{null >= observed}) / (B + 1).
    A constant variable is independent of anything: statistic 0, p-value 1.
    """
    full, complement = _vector(full, "full"), _vector(complement, "complement")
    if full.shape != complement.shape:
        raise InputError(f"full {full.shape} and complement {complement.shape} must hold the same prompts")
    if int(n_permutations) < 1:
        raise InputError(f"n_permutations must be >= 1, got {n_permutations}")
    n = full.size
    Kc, s_full = _centred_gram(full)
    Lc, s_comp = _centred_gram(complement)
    details = {"n_permutations": int(n_permutations), "bandwidth_full": s_full, "bandwidth_complement": s_comp}
    if Kc is None or Lc is None:
        return CircuitTestResult("independence", 0.0, 1.0, "complement's metric independent of the model's",
                                 "the complement carries task information", n, {**details, "constant": True})
    scale = (n - 1) ** 2
    observed = float((Kc * Lc).sum() / scale)
    rng = np.random.default_rng(random_state)
    null = np.empty(int(n_permutations))
    for b in range(null.size):
        p = rng.permutation(n)
        # permuting y permutes rows and columns of L, and H is permutation invariant, so HL_pH = (HLH)_p
        null[b] = (Kc * Lc[np.ix_(p, p)]).sum() / scale
    pvalue = (1.0 + float((null >= observed).sum())) / (null.size + 1.0)
    return CircuitTestResult("independence", observed, pvalue, "complement's metric independent of the model's",
                             "the complement carries task information", n, {**details, "null": null})


# ---- minimality ------------------------------------------------------------------------------------

def minimality_from_effects(edge_effect: Any, reference_effect: Any, *, quantile: float = PAPER_QUANTILE,
                            alpha: float = 0.05, correction: str = "holm", tol: float = 0.0) -> MinimalityResult:
    """Return the per-edge minimality family from knockout effects (losses >= 0: edge e's, and each reference's).

    For edge e, T_e = #{j : effect_e > reference_j} ~ Binomial(R, π_e) over the references;
    H0_e: π_e >= quantile, p_e = P(Binomial(R, quantile) <= T_e) (the reference code's
    ``binomtest(..., alternative="less")``). ``tol``: RMS losses within it count as ties, which count against
    the edge (it does not beat a reference it only equals). ``correction``: "holm" controls the family-wise error
    of declaring any needed edge redundant under any dependence (the R references are shared); "bh" controls
    the false discovery rate (valid under positive dependence only).
    """
    e = np.asarray(edge_effect, dtype=np.float64).ravel()
    r = np.asarray(reference_effect, dtype=np.float64).ravel()
    if e.size < 1 or r.size < 1 or not (np.isfinite(e).all() and np.isfinite(r).all()):
        raise InputError("need >= 1 finite edge effect and >= 1 finite reference effect")
    if (e < 0).any() or (r < 0).any():
        raise InputError("knockout effects are faithfulness losses, >= 0; got a negative one")
    if not 0 < quantile < 1 or not 0 < alpha < 1:
        raise InputError(f"quantile and alpha must lie in (0, 1), got {quantile}, {alpha}")
    if correction not in CORRECTIONS:
        raise InputError(f"correction must be one of {CORRECTIONS}, got {correction!r}")
    counts = _exceeds(e[:, None], r[None, :], float(tol)).sum(axis=1)
    pvalue = stats.binom.cdf(counts, r.size, quantile)
    adjusted = holm_adjust(pvalue) if correction == "holm" else bh_adjust(pvalue)
    return MinimalityResult(counts.astype(np.int64), pvalue, adjusted, adjusted <= alpha, e, r,
                            float(quantile), float(alpha), correction)


def minimality_test(circuit: Any, minus_edge: Any, inflated: Any, inflated_minus: Any, *,
                    quantile: float = PAPER_QUANTILE, alpha: float = 0.05, correction: str = "holm"
                    ) -> MinimalityResult:
    """Return the minimality family from per-prompt metrics of C, C − e per edge, and R inflated circuits with and
    without one of their added edges.

    Edge e's effect is loss(C, C − e). Reference j follows the paper (blei-lab/circuitry ``sample_inflated(1)``):
    C + P_j is the circuit with a random input → logits path added, r_j one uniformly random newly added edge of
    it, and the reference effect loss(C + P_j, C + P_j − r_j). Ties within float rounding (:func:`float_tolerance`
    of every metric given) count against the edge.
    """
    circuit = _vector(circuit, "circuit")
    minus = _matrix(minus_edge, circuit.size, "minus_edge")
    infl = _matrix(inflated, circuit.size, "inflated")
    infl_minus = _matrix(inflated_minus, circuit.size, "inflated_minus")
    if infl.shape != infl_minus.shape:
        raise InputError(f"inflated {infl.shape} and inflated_minus {infl_minus.shape} must pair column by column")
    ref = ((infl - infl_minus) ** 2).mean(axis=0)
    return minimality_from_effects(faithfulness_loss(circuit, minus), ref, quantile=quantile, alpha=alpha,
                                   correction=correction, tol=float_tolerance(circuit, minus, infl, infl_minus))


# ---- sufficiency and partial necessity --------------------------------------------------------------

def versus_random(count: int, n_random: int, quantile: float | None) -> float:
    """Return the p-value of a circuit that beats ``count`` of ``n_random`` random circuits (ties counted as losses).

    A quantile q (the paper's, 0.9 by default in the tests): P(Binomial(n_random, q) >= count), the null that the
    circuit beats a random circuit with probability G <= q. ``quantile=None``: the exact rank p-value under
    exchangeability with the random circuits, (1 + n_random − count) / (n_random + 1).
    """
    if quantile is None:
        return (1.0 + n_random - count) / (n_random + 1.0)
    if not 0 < quantile < 1:
        raise InputError(f"quantile must lie in (0, 1) or be None, got {quantile}")
    return float(stats.binom.sf(count - 1, n_random, quantile))


def _random_test(name: str, own: float, others: np.ndarray, better: str, quantile: float | None, n: int,
                 null: str, means: str, tol: float) -> CircuitTestResult:
    """Return the result of comparing one loss with random circuits' losses (``better``: "lower" or "higher")."""
    beats = _exceeds(others, np.asarray(own), tol) if better == "lower" else _exceeds(np.asarray(own), others, tol)
    count = int(beats.sum())
    low, high = clopper_pearson(count, others.size)
    details = {"loss": own, "random_losses": others, "count": count, "n_random": int(others.size),
               "quantile": quantile, "g_hat": count / others.size, "ci_low": low, "ci_high": high,
               "ci_level": CI_LEVEL, "tolerance": tol}
    return CircuitTestResult(name, count / others.size, versus_random(count, others.size, quantile), null, means, n,
                             details)


def _null_text(base: str, quantile: float | None) -> str:
    """Return the null's words: against the quantile G <= q, or exchangeability (the exact rank test)."""
    if quantile is None:
        return base + " (exchangeable with them: exact rank test)"
    return base + f": it beats one with probability G <= {quantile:g}"


def sufficiency_test(full: Any, circuit: Any, random_circuits: Any, *, quantile: float | None = PAPER_QUANTILE
                     ) -> CircuitTestResult:
    """Return the test that the circuit is more faithful than random circuits of its size (lower loss to the model).

    ``random_circuits``: [prompts, R] per-prompt metric of R random connected circuits with at least the
    circuit's edge count (circuitstat.stats.circuit_paths.sample_circuit). The statistic Ĝ is the fraction of
    random circuits whose loss is higher beyond float rounding. Rejecting means the circuit is sufficient.
    """
    full, circuit = _vector(full, "full"), _vector(circuit, "circuit")
    rand = _matrix(random_circuits, full.size, "random_circuits")
    own = float(faithfulness_loss(full, circuit))
    return _random_test("sufficiency", own, faithfulness_loss(full, rand), "lower", quantile, full.size,
                        _null_text("the circuit is no more faithful than a random circuit of its size", quantile),
                        "the circuit is sufficient (more faithful than random circuits)",
                        float_tolerance(full, circuit, rand))


def partial_necessity_test(full: Any, complement: Any, random_complements: Any, *,
                           quantile: float | None = PAPER_QUANTILE) -> CircuitTestResult:
    """Return the test that knocking out the circuit hurts more than knocking out random circuits of its size.

    ``complement``: per-prompt metric with the circuit's edges ablated; ``random_complements``: [prompts, R]
    the same with R random circuits of its size ablated. Rejecting means the circuit is partially necessary.
    """
    full, complement = _vector(full, "full"), _vector(complement, "complement")
    rand = _matrix(random_complements, full.size, "random_complements")
    own = float(faithfulness_loss(full, complement))
    return _random_test("partial_necessity", own, faithfulness_loss(full, rand), "higher", quantile, full.size,
                        _null_text("ablating the circuit hurts no more than ablating a random circuit of its size",
                                   quantile),
                        "the circuit is partially necessary", float_tolerance(full, complement, rand))
