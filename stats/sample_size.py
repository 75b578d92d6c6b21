"""How many prompts do I need? Predictions at N from a pilot's per-example scores S [n0, E].

Three predictions, each with a stated error (docs/sample-size.md has the measured calibration):

* **Interval width per edge** (the default per-edge interval, the symmetric studentized bootstrap,
  circuitstat.stats.intervals): its half-width is q_N * s_N / sqrt(N), q_N the level quantile of |t*|
  and s_N the sample SD. From the pilot: q_0 = half-width * sqrt(n0) / s_0 of the pilot's own interval
  (the same estimator), and q_N = t_N + (q_0 - t_0) min(1, n0 / N), t_n the Student t quantile with n - 1
  degrees of freedom (the symmetric bootstrap-t's skewness/kurtosis correction to it is O(1/n): Hall 1992,
  sec. 3.6; not amplified below n0, where it would multiply q_0's noise). The SD
  of a small sample is biased low (E[s] < sigma, much more so with heavy tails), so sigma is
  bias-corrected by the pilot's bootstrap: with m* the mean of the resampled SDs s*,
  sigma = s_0 * s_0 / m* (ratio bootstrap bias correction, Efron & Tibshirani 1993 ch. 10), and the
  SD at N is expected at sigma * (1 + (m*/s_0 - 1) n0 / N) (the bias is O(1/n)), times median_sd_growth: under
  heavy tails the median SD grows with N faster than that, as a dataset of N holds rare large prompts a pilot
  rarely does, by the median of s_N / s_0 under the F law below at the edges' pooled kurtosis over its median
  at the normal's (1 on normal pilots; issue 49: the median realised / predicted width was 1.10 on the spiky
  population at N = 512 without it), raised to the pilot's self_calibration at the median (its halves as truth:
  1 where the F law's median holds; the pilots' pooled kurtosis understates tails heavier than 32 prompts show, as
  on next-token models: 1.15 at N = 512 without it, 1.09 with it) and capped at the one-sided bound width_upper
  (a pilot whose halves disagree wildly gets a huge factor; the point never exceeds the bound, which is then
  flagged as planning nothing). Stated error: the
  jackknife SD c_0 of log s_0 (leave-one-out SDs in closed form; by the Efron-Stein inequality the
  jackknife variance is biased upwards, not downwards as the bootstrap's is under heavy tails: measured
  coverage 0.75 / 0.81 where the bootstrap's gave 0.67 / 0.75, docs/sample-size.md), floored at the
  normal-theory 1 / (2 (n0 - 1)) because it is itself a noisy fourth-moment estimate, and that of log s_N,
  c_0 sqrt(n0 / N); plus the Monte Carlo variance of the realised and the pilot's bootstrap quantiles of
  |t*| (log_width_variance). The prediction interval is width * exp(+- z_p rel_error), for the width
  one dataset of N prompts will show (its own sampling variation included).
  The planning number is the one-sided upper bound width_upper: s_0 times the level quantile of s_N / s_0
  under F(d_N, d_0), Satterthwaite df from the edge's kurtosis (edge_kurtosis, kurtosis_growth), inflated
  on the log scale by self_calibration (the pilot's rows as the population, its halves as pilots), read at
  tail_level: the quantile 1 - (1 - level) / (D + 1), D = log2(N / n0), a union bound over the D doublings from
  n0 to N in each of which tail events the pilot has not seen can appear, plus the calibration's own error
  (issue 49: with the plain level the bound held 0.84-0.87 on the spiky population at N >= 128, whose rare-spike
  edges look normal in a pilot of 32; with the D doublings alone 0.895 at N = 64). width_upper_below_pilot says
  whether the bound is below the pilot's own width (pilot_width), i.e. whether the pilot can promise that N
  prompts narrow the interval at all: under tails a pilot cannot bound (one 30-SD spike per edge in 32 rows) the
  bound is still an upper bound, but 10^6 times the pilot's width, and plans nothing.
* **Expected data-level Jaccard** J_m of the top-k circuit, E[Jaccard(top-k of D1, top-k of D2)] for two
  independent datasets of m prompts, at m = floor(N/2) (the primary: the expectation of the jaccard_half an
  audit of N prompts reports from its disjoint halves, circuitstat.stats.stability_halves) and at m = N (the
  extrapolated J_N, the estimand of circuitstat.stats.stability_data). A parametric bootstrap from a model fitted to the pilot: a dataset of N is N of the
  pilot's centred rows drawn with replacement, plus model means. Rows, not a Gaussian with the pilot's
  covariance: both give the same covariance of the means at N, but per-example scores are skewed and
  heavy-tailed, and resampling rows keeps the tail shape the pilot saw and the correlation across edges
  without an E x E covariance. The model means are the pilot means *deconvolved*: the pilot means
  spread wider than the true means by their own noise (E[(m - c)^2] = (mu - c)^2 + sigma^2 / n0), and
  that false spread makes circuits at N > n0 look more stable than they are, so each mean is moved
  towards c (0 for absolute ranking, the mean over edges for signed) to (m - c)^2 - s^2 / n0 (zero
  where negative). The default, ``means="tested"``, first asks whether the pilot tells any edge's mean from c at
  all (``homogeneity_pvalue``: a chi-square test for many small differences and a Bonferroni max-|t| test for a
  few large ones, joined by Bonferroni, at ``HOMOGENEITY_LEVEL``); where it cannot, every model mean is tied at c,
  because deconvolution keeps the pilot's order of noise-level means and a pilot of pure noise then predicts
  circuits that stabilise (normal population: J_N/2 at N = 512, k = 5, predicted 0.54 against a true 0.07;
  tied: 0.10). ``means="deconvolved"`` skips the test. ``means="posterior"`` instead draws the means, per simulated J_N, from the posterior of
  an empirical-Bayes g-model (the grid NPMLE of the means' prior, circuitstat.stats.gmodel), so the pilot's
  order of near-tied edges is redrawn rather than kept. ``means="pilot"`` keeps the plain means (its interval covered less: 6 of 32 cells below
  0.90 against 3, docs/sample-size.md).
  Stated error: se, the spread of the same prediction over bootstrap resamples of the pilot's rows (each
  refitted), less its Monte Carlo part; and the bias the pilot cannot see, bracketed as the data-level
  interval brackets it (circuitstat.stats.stability_data): the interval is [min(J, J_half) - z_p se,
  max(J, J_plugin) + z_p se], J_half the Jaccard of disjoint halves of the pilot (unbiased for J at n0/2,
  a lower bound for J_N at N >= n0/2) and J_plugin the prediction from the plain pilot means.
* **Chance the data-level interval's lower end clears a target**: the fraction of simulated datasets
  of N (each from a model refitted to a bootstrap resample of the pilot, so the pilot's uncertainty
  is in the probability) whose ``circuit_stability`` data-level interval has jaccard_data_ci_low >=
  target, with its binomial Monte Carlo error.

What a pilot cannot see it cannot predict: an edge whose mean rests on events rarer than 1/n0 looks
light-tailed in the pilot, so its width and J_N at N are predicted too small / too stable
(circuitstat.stats.reliability says the same of intervals).
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np
from scipy.special import ndtri
from scipy.stats import chi2 as sps_chi2
from scipy.stats import f as sps_f
from scipy.stats import t as sps_t

from circuitstat.core.errors import InputError
from circuitstat.core.seeds import as_seed_sequence, spawn_seeds
from circuitstat.core.topk import ranking_key, row_seeds

from .intervals import bootstrap_edges
from .pilot_model import HOMOGENEITY_LEVEL, PilotFit, fit_pilot, homogeneity_pvalue
from .resampling import ResamplingPlan, check_score_matrix, map_edge_chunks, plan_weights
from .stability import jaccard_moments, chance_jaccard
from .topk_stream import streaming_topk

__all__ = ["MIN_PILOT", "simulated_datasets",
           "predict_widths", "jackknife_log_sd", "edge_kurtosis", "satterthwaite_df", "log_sd_ratio_upper",
           "self_calibration", "tail_level", "kurtosis_growth", "predict_stability", "half_jaccard", "clear_probability",
           "check_pilot", "expected_jaccard", "median_sd_growth"]

#: fewest pilot examples: the SD's bootstrap and the studentized interval need some spread to work on
MIN_PILOT = 16
#: posterior draws of the means per simulated J_N (each shared by its datasets, as the truth is by two datasets)
N_DRAWS = 5
WIDTH_COVERS = ("the width of the per-edge interval one dataset of n prompts will show (its own sampling "
                "variation and the pilot's included)")
JACCARD_COVERS = "the expected Jaccard between the top-k circuits of two independent datasets of n prompts"


def check_pilot(S: np.ndarray, ns: Sequence[int], *, prediction_level: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    """Return (S float64, sorted unique ns) or raise InputError naming the fix."""
    try:
        S = np.asarray(check_score_matrix(S), dtype=np.float64)
    except ValueError as e:  # NaN or inf scores, an empty or ragged matrix: the pilot's problem, named
        raise InputError(f"the pilot's scores cannot be used: {e}; rerun the pilot (a metric that is finite on "
                         "every prompt)") from None
    if S.shape[0] < MIN_PILOT:
        raise InputError(f"a pilot needs at least {MIN_PILOT} examples, got {S.shape[0]}; attribute more prompts "
                         "(--n)")
    ns_arr = np.unique(np.asarray(list(ns), dtype=np.int64))
    if ns_arr.size == 0 or ns_arr.min() < 2:
        raise InputError(f"the sizes N to predict at must be integers >= 2, got {list(ns)}")
    if not 0 < prediction_level < 1:
        raise InputError(f"prediction_level must lie in (0, 1), got {prediction_level}")
    return S, ns_arr


# --- widths ---------------------------------------------------------------------------------------------------
def _mean_resampled_sd(S: np.ndarray, plan: ResamplingPlan) -> np.ndarray:
    """Return the mean over the plan's resamples of each edge's resampled SD (ddof=1), from the engine."""
    W, T = plan_weights(plan), plan.totals

    def reduce(r: np.ndarray, sc: np.ndarray, sl: slice) -> np.ndarray:
        theta = sc.mean(axis=1)
        u = sc - theta[:, None]
        d = r - theta[:, None]  # resampled mean minus the sample mean: centred sums, no cancellation
        var = np.maximum(((u * u) @ W) / T - d * d, 0.0) * (T / (T - 1.0))
        return np.sqrt(var).mean(axis=1)

    return np.concatenate(list(map_edge_chunks(S, plan, reduce, check=False)))


def jackknife_log_sd(S: np.ndarray) -> np.ndarray:
    """Return the jackknife standard error of log SD (ddof=1) per column of S [n, E] (0 for a constant column).

    Leave-one-out variances in closed form; a leave-one-out SD of 0 (every other value equal) is floored
    at 1e-3 of the full SD, so a column carried by one example gets a large, finite error.
    """
    S = np.asarray(S, dtype=np.float64)
    n = S.shape[0]
    s = S.std(axis=0, ddof=1)
    u = S - S.mean(axis=0)  # centred: no cancellation in the sums of squares
    total, sq = u.sum(axis=0), (u * u).sum(axis=0)
    var_i = (sq - u * u - (total - u) ** 2 / (n - 1)) / (n - 2)  # variance of the other n - 1 values
    const = ~(s > 0)
    floor = np.where(const, 1.0, 1e-3 * s) ** 2  # a constant column: any positive floor, its error is 0 anyway
    log_i = 0.5 * np.log(np.maximum(var_i, floor))
    out = np.sqrt((n - 1) / n * ((log_i - log_i.mean(axis=0)) ** 2).sum(axis=0))
    return np.where(const, 0.0, out)


def edge_kurtosis(S: np.ndarray) -> tuple[np.ndarray, float]:
    """Return (per-edge kurtosis shrunk halfway to the pooled one and floored at 3, the pooled kurtosis) of S [n, E].

    The kurtosis b2 = n sum u^4 / (sum u^2)^2 of each column's residuals u; pooled: the mean of b2 over the
    non-constant columns (the edges' standardised residuals pooled); a constant column gets the pooled value.
    The floor at 3 (the normal's) stops a pilot claiming lighter-than-normal tails on noise.
    """
    S = np.asarray(S, dtype=np.float64)
    u = S - S.mean(axis=0)
    m2 = (u * u).sum(axis=0)
    ok = m2 > 0
    b2 = np.where(ok, S.shape[0] * (u**4).sum(axis=0) / np.where(ok, m2, 1.0) ** 2, np.nan)
    pooled = float(np.nanmean(b2)) if ok.any() else 3.0
    return np.maximum(np.where(ok, (b2 + pooled) / 2, pooled), 3.0), max(pooled, 3.0)


def satterthwaite_df(n: int | np.ndarray, kurtosis: np.ndarray) -> np.ndarray:
    """Return the df d with s^2 / sigma^2 ~ chi2_d / d matching Var(s^2) / sigma^4 = (kappa - (n-3)/(n-1)) / n.

    Satterthwaite's moment match (n - 1 at kappa = 3, the normal's exact law; fewer with heavier tails).
    """
    n = np.asarray(n, dtype=np.float64)
    return 2.0 * n / (np.asarray(kurtosis, dtype=np.float64) - (n - 3.0) / (n - 1.0))


def log_sd_ratio_upper(n_from: int, n_to: int, kurtosis: np.ndarray, level: float) -> np.ndarray:
    """Return the level upper quantile of log(s_to / s_from), two independent samples' SDs, per kurtosis.

    s_to^2 / s_from^2 is a ratio of scaled chi-squares, F(d_to, d_from) with Satterthwaite's df: skewed, its
    long right tail the pilot's SD drawn low (exact under normality, where both df are n - 1).
    """
    d_to, d_from = satterthwaite_df(n_to, kurtosis), satterthwaite_df(n_from, kurtosis)
    return 0.5 * np.log(sps_f.ppf(level, d_to, d_from))


def tail_level(level: float, n0: int, n: int) -> float:
    """Return the quantile 1 - (1 - level) / (D + 1) at which the pilot's halves calibrate the bound at n, D the
    doublings log2(n / n0) from the pilot to n (at least 1).

    A union bound over D + 1 ways for the bound to fail, each given (1 - level) / (D + 1) of the miss chance:
    * the D doublings: each can show tail events the pilot has not seen (an edge whose spikes are rarer than
      1 / n0), and under self-similarity (as kurtosis_growth assumes) each shows as many as the pilot's last
      doubling, which its halves measure;
    * the calibration itself: the halves measure that last doubling in one pilot, and a pilot whose own tail
      events happened to fall evenly across its halves (a quiet last doubling) understates every doubling's
      chance at once. The factor is an estimate, and its error is one more event (issue 49 item 3: with D events
      alone the bound held 0.895 +- 0.003 at n = 64 and 0.896 +- 0.004 at 128 on the spiky population).
    D = 1 (n <= 2 n0) reads 1 - (1 - level) / 2.
    """
    return 1.0 - (1.0 - level) / (max(1.0, float(np.log2(float(n) / n0))) + 1.0)


def self_calibration(S: np.ndarray, level: float, *, quantile: float | None = None, n_draws: int = 40,
                     seed: Any = None) -> float:
    """Return the factor c >= 1 on the log scale that makes the SD bound hold inside the pilot, the pilot as truth.

    The pilot's rows stand for the population (its SD, ddof=0, is then sigma exactly). For n_draws random
    halves (n0 // 2 rows drawn with replacement: an i.i.d. sample of that population) the bound on
    log(sigma / s_half) predicted from the half alone at the quantile q (default: level; its own kurtosis; the
    F bound as the full run's df grow, 0.5 log(d / chi2_{d, 1 - q})) standardises the realised log ratio; c is
    the q quantile of those standardised errors pooled over edges and draws (1 where the model holds, at any
    q: the excess of the halves' error tail over the model's own, read at q; predict_widths reads it at
    tail_level). The spikes a half misses
    are the pilot's, as those the pilot misses are the population's. A half constant where the pilot is not
    counts with its SD floored at 1e-3 of the pilot's (a large error).
    """
    q = level if quantile is None else float(quantile)
    S = np.asarray(S, dtype=np.float64)
    n0 = S.shape[0]
    h = n0 // 2
    sigma = S.std(axis=0)
    keep = sigma > 0
    if not keep.any():
        return 1.0
    rng = np.random.default_rng(as_seed_sequence(seed))
    errs = []
    for _ in range(int(n_draws)):
        A = S[rng.integers(0, n0, h)][:, keep]
        s_a = np.maximum(A.std(axis=0, ddof=1), 1e-3 * sigma[keep])
        d = satterthwaite_df(h, edge_kurtosis(A)[0])
        errs.append(np.log(sigma[keep] / s_a) / (0.5 * np.log(d / sps_chi2.ppf(1.0 - q, d))))
    return max(1.0, float(np.quantile(np.concatenate(errs), q)))


def kurtosis_growth(S: np.ndarray, *, n_draws: int = 20, seed: Any = None) -> float:
    """Return the pilot's pooled kurtosis over the mean pooled kurtosis of its halves (>= 1).

    A sample's kurtosis cannot exceed about its size, so under heavy tails the apparent kurtosis grows with n
    and the pilot's understates the population's. Assumed self-similar: the pilot understates the
    population's by the factor its halves (n0 // 2 rows drawn with replacement) understate the pilot's.
    1 on light tails (floored: a normal half's kurtosis is biased low too, by a factor about 1.06 at n0 = 32).
    """
    S = np.asarray(S, dtype=np.float64)
    n0 = S.shape[0]
    rng = np.random.default_rng(as_seed_sequence(seed))
    halves = np.mean([edge_kurtosis(S[rng.integers(0, n0, n0 // 2)])[1] for _ in range(int(n_draws))])
    return max(1.0, edge_kurtosis(S)[1] / float(halves))


def median_sd_growth(n0: int, n: int, pooled_kurtosis: float) -> float:
    """Return the heavy-tail factor on the SD expected at n: the median of s_n / s_0 under F(d_n, d_0) at the
    pooled kurtosis over its median at the normal's (exactly 1 at kappa = 3; > 1 for n > n0 under heavy tails).

    Why (issue 49): under heavy tails the median edge's realised SD grows with n faster than the ratio bootstrap's
    O(1/n) bias says, because a pilot rarely holds the rare large prompts that a dataset of n does (median
    realised / predicted width 1.10 on the spiky population at n = 512 without it). Which edges have such
    prompts the pilot cannot tell (one that showed none looks normal), so every edge gets the law of the
    edges' standardised residuals pooled (edge_kurtosis's pooled value, times kurtosis_growth), the same
    Satterthwaite F law whose upper quantile width_upper reads; the normal's median is divided out because
    the bootstrap's bias correction already carries the light-tailed part.
    """
    kappa = np.array([max(float(pooled_kurtosis), 3.0), 3.0])
    med = sps_f.ppf(0.5, satterthwaite_df(int(n), kappa), satterthwaite_df(int(n0), kappa))
    return float(np.sqrt(med[0] / med[1]))


def log_width_variance(c0: np.ndarray, n0: int, n: int, *, n_resamples: int,
                       confidence_level: float) -> np.ndarray:
    """Return the variance of log(realised width at n / predicted width) per edge: the stated error squared.

    Three parts. (1) log s_0 and log s_n: the jackknife variance c0^2 of log s_0, scaled by n0 / n for the
    dataset of n, but floored at the normal-theory value 1 / (2 (n0 - 1)) (Var(log s) = (kappa - 1) / (4 n)
    to first order, kappa = 3; the exact law under normality is s_n^2 / s_0^2 ~ F(n - 1, n0 - 1)). The
    jackknife variance is a fourth-moment estimate from n0 rows: on normal data its CV is about 0.5 at
    n0 = 32 (about 9 effective degrees of freedom), so a z interval on it covered 0.87-0.89 against 0.90
    (0.90 with the true variance); the floor stops a pilot claiming lighter-than-normal tails on noise.
    (2) The Monte Carlo error of the realised interval's bootstrap quantile of |t*| at n_resamples: a
    sample quantile's variance p (1 - p) / (B f(q)^2) (Serfling 1980, sec. 2.3), to first order with
    |t*| ~ |T|, T ~ t_{n-1}: f its density at its own quantile (the pilot's |t*| law is unknown, and its
    density at a far-out q_0 would make the term explode). (3) The same for the pilot's quantile, which
    enters q_n shrunk by min(1, n0 / n).
    """
    var_s = np.maximum(c0**2, 1.0 / (2.0 * (n0 - 1))) * (1.0 + n0 / float(n))
    mc = quantile_mc_variance(n0, n, n_resamples=n_resamples, confidence_level=confidence_level)
    return np.where(c0 > 0, var_s + mc, 0.0)


def quantile_mc_variance(n0: int, n: int, *, n_resamples: int, confidence_level: float) -> float:
    """Return the Monte Carlo variance of log q from the realised and the pilot's bootstrap quantiles of |t*|.

    Parts (2) and (3) of log_width_variance: p (1 - p) / (B f(q)^2 q^2) with |t*| ~ |T|, T ~ t_{n-1}, the
    pilot's shrunk by min(1, n0 / n) as q_0 enters q_n.
    """
    p = confidence_level

    def mc(df: int) -> float:
        tq = float(sps_t.ppf(0.5 + p / 2, df))
        f = 2.0 * float(sps_t.pdf(tq, df))  # density of |T| at its p quantile
        return p * (1.0 - p) / (n_resamples * f**2 * tq**2)

    return mc(n - 1) + min(1.0, n0 / float(n)) ** 2 * mc(n0 - 1)


def predict_widths(S: np.ndarray, ns: Sequence[int], *, confidence_level: float = 0.95,
                   prediction_level: float = 0.9, n_resamples: int = 999, seed: Any = None) -> dict[str, np.ndarray]:
    """Return per (n, edge) the predicted width of the default per-edge interval at n, with its prediction interval.

    Columns: n, edge, width (predicted), width_upper (the planning number: a one-sided upper prediction
    bound at prediction_level for the width one dataset of n will show, from the skewed F law of s_n / s_0
    with Satterthwaite df at the edge's kurtosis, inflated by the pilot's self_calibration at tail_level of n),
    width_upper_below_pilot (width_upper < pilot_width: only then can the pilot promise that n prompts narrow the
    interval; a bound above the width the pilot already shows plans nothing; not that the bound holds, which on spiky
    populations it did less often on informative edges: docs/sample-size.md), kurtosis (the edge's, shrunk to the
    pooled, times kurtosis_growth), calibration (that factor), width_pi_low /
    width_pi_high (prediction interval at prediction_level, log-normal), q (predicted |t*| quantile), sd (expected
    SD at n, with the heavy-tail factor median_sd_growth raised to the pilot's self_calibration at the median, the
    width capped at width_upper), pilot_width, rel_error (the log-scale SD of the prediction). See the module
    docstring.
    """
    S, ns_arr = check_pilot(S, ns, prediction_level=prediction_level)
    n0, E = S.shape
    plan = ResamplingPlan.bootstrap(n0, n_resamples, seed)
    boot = bootstrap_edges(S, plan, method="studentized_symmetric", confidence_level=confidence_level)
    lo, hi = np.asarray(boot.confidence_interval.low), np.asarray(boot.confidence_interval.high)
    s0 = S.std(axis=0, ddof=1)
    m_star = _mean_resampled_sd(S, plan)
    c0 = jackknife_log_sd(S)
    ok = s0 > 0
    z = float(ndtri(0.5 + confidence_level / 2))
    zp = float(ndtri(0.5 + prediction_level / 2))
    with np.errstate(divide="ignore", invalid="ignore"):
        q0 = np.where(ok, (hi - lo) / 2 * np.sqrt(n0) / s0, z)
        # ratio bias correction; a bootstrap mean SD below half the sample's is not trusted to correct by more
        ratio = np.where(ok, np.clip(m_star / s0, 0.5, None), 1.0)
    sigma = s0 / ratio
    cols: dict[str, list] = {k: [] for k in ("n", "edge", "width", "width_upper", "width_upper_below_pilot",
                                             "kurtosis", "calibration", "width_pi_low", "width_pi_high", "q", "sd",
                                             "pilot_width", "rel_error")}
    t0 = float(sps_t.ppf(0.5 + confidence_level / 2, n0 - 1))
    c_cal, c_growth = spawn_seeds(spawn_seeds(seed, 2)[1], 2)
    kurt_edge, kurt_pooled = edge_kurtosis(S)
    growth = kurtosis_growth(S, seed=c_growth)
    kappa = kurt_edge * growth
    z1 = float(ndtri(prediction_level))
    # the heavy-tail factor's exponent, self-calibrated at the median on the same halves as the bound's (>= 1)
    calib_median = self_calibration(S, prediction_level, quantile=0.5, seed=c_cal)
    for n in ns_arr:
        shrink = n0 / float(n)
        # the excess of q over Student's t is O(1/n): shrunk for n > n0, never amplified (noise in q_0) for n < n0
        q = float(sps_t.ppf(0.5 + confidence_level / 2, n - 1)) + (q0 - t0) * min(1.0, shrink)
        rel = np.sqrt(log_width_variance(c0, n0, int(n), n_resamples=n_resamples,
                                         confidence_level=confidence_level))
        # the planning number: s_0 times the F bound on s_n / s_0, self-calibrated (at the tail level of the
        # doublings to n: the same halves, seed c_cal, for every n), and the quantiles' MC error
        calib = self_calibration(S, prediction_level, quantile=tail_level(prediction_level, n0, int(n)), seed=c_cal)
        log_up = calib * log_sd_ratio_upper(n0, int(n), kappa, prediction_level) + z1 * np.sqrt(
            quantile_mc_variance(n0, int(n), n_resamples=n_resamples, confidence_level=confidence_level))
        upper = 2 * q * s0 / np.sqrt(n) * np.exp(log_up)
        growth_n = median_sd_growth(n0, int(n), kurt_pooled * growth) ** calib_median
        # the point never above the one-sided bound (where the halves disagree wildly, both are huge: the bound is
        # then flagged as planning nothing, width_upper_below_pilot)
        width = np.minimum(2 * q * sigma * (1.0 + (ratio - 1.0) * shrink) * growth_n / np.sqrt(n), upper)
        sd_n = width * np.sqrt(n) / (2 * q)
        # a bound above what the pilot already shows cannot plan N (strict: an edge constant in the pilot, 0 and 0,
        # has no spread to bound from, so its 0 is no promise either)
        for key, v in (("n", np.full(E, n)), ("edge", np.arange(E)), ("width", width), ("width_upper", upper),
                       ("width_upper_below_pilot", upper < hi - lo), ("kurtosis", kappa),
                       ("calibration", np.full(E, calib)),
                       ("width_pi_low", width * np.exp(-zp * rel)), ("width_pi_high", width * np.exp(zp * rel)),
                       ("q", q), ("sd", sd_n), ("pilot_width", hi - lo), ("rel_error", rel)):
            cols[key].append(v)
    return {k: np.concatenate(v) for k, v in cols.items()}


# --- circuit stability ----------------------------------------------------------------------------------------
def _check_ks(ks: Sequence[int], n_edges: int) -> np.ndarray:
    """Return sorted unique ks, or InputError when one is outside 1..E-1."""
    ks_arr = np.unique(np.asarray(list(ks), dtype=np.int64))
    if ks_arr.size == 0 or ks_arr.min() < 1 or ks_arr.max() >= n_edges:
        raise InputError(f"circuit sizes k must lie in 1..{n_edges - 1} (the pilot has {n_edges} edges), "
                         f"got {list(ks)}")
    return ks_arr


def expected_jaccard(P: np.ndarray, n: int, ks: Sequence[int], *, ranking: str, n_datasets: int,
                     seed: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Return (J_n per k, its jackknife Monte Carlo error): the mean pairwise Jaccard of the top-k circuits of
    n_datasets datasets of n rows drawn with replacement from the finite population P [n_pop, E]."""
    P = np.asarray(P, dtype=np.float64)
    ks_arr = _check_ks(ks, P.shape[1])
    rng = np.random.default_rng(as_seed_sequence(seed))
    idx = rng.integers(0, P.shape[0], (int(n_datasets), int(n)))
    plan = ResamplingPlan.from_indices(idx, n_obs=P.shape[0])  # the engine gives each dataset's means as W.P/n
    state, _ = streaming_topk(P, plan, int(ks_arr.max()), ranking, row_seeds(rng, int(n_datasets)))
    moments = [jaccard_moments(state.idx[:, :k], int(k), P.shape[1], 2**26) for k in ks_arr]
    return np.array([m[0] for m in moments]), np.array([m[2] for m in moments])


def _dataset_jaccard(fit: PilotFit, n: int, n_sim: int, ks: np.ndarray, ranking: str,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Return (mean pairwise Jaccard, its Monte Carlo error) per k over n_sim simulated datasets of n."""
    if fit.prior is None:
        return expected_jaccard(fit.residuals + fit.model_means, n, ks, ranking=ranking, n_datasets=n_sim,
                                seed=int(rng.integers(2**63)))
    # J_N averaged over posterior draws of the means, each draw's datasets sharing it; MC error over draws
    per = max(2, int(n_sim) // N_DRAWS)
    J = np.array([expected_jaccard(fit.residuals + mu, n, ks, ranking=ranking, n_datasets=per,
                                   seed=int(rng.integers(2**63)))[0] for mu in fit.prior.draw(rng, N_DRAWS)])
    return J.mean(axis=0), J.std(axis=0, ddof=1) / np.sqrt(N_DRAWS)


def _refit_se(S: np.ndarray, ns: np.ndarray, ks: np.ndarray, ranking: str, means: str, n_outer: int,
              n_sim: int, seed: Any) -> np.ndarray:
    """Return [n, k] the spread of the prediction over n_outer bootstrap refits of the pilot, less its MC part."""
    c_plan, c_outer = spawn_seeds(as_seed_sequence(seed), 2)
    plan = ResamplingPlan.bootstrap(S.shape[0], int(n_outer), c_plan)
    rng = np.random.default_rng(c_outer)
    star = np.empty((int(n_outer), ns.size, 2, ks.size))
    for o in range(int(n_outer)):
        fit_o = fit_pilot(S[plan.indices(o)], ranking=ranking, means=means)
        star[o] = [_dataset_jaccard(fit_o, n, n_sim, ks, ranking, rng) for n in ns]
    raw = star[:, :, 0].var(axis=0, ddof=1)
    # each refit's value carries its own Monte Carlo error: remove it, never more than half the spread
    return np.maximum(raw - np.mean(star[:, :, 1] ** 2, axis=0), raw / 2)


def half_jaccard(S: np.ndarray, ks: Sequence[int], *, ranking: str, n_splits: int = 30,
                 seed: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Return (mean Jaccard, its SE) per k between the top-k circuits of disjoint random halves of S's rows:
    unbiased for J_{n/2}, the data-level Jaccard at half the pilot's size (two independent datasets)."""
    from .stability_data import split_counts

    n0, E = S.shape
    ks_arr = _check_ks(ks, E)
    counts = split_counts(n0, int(n_splits), seed).reshape(int(n_splits), 6, n0)[:, :2].reshape(-1, n0)
    rng = np.random.default_rng(as_seed_sequence(seed).spawn(1)[0])
    state, _ = streaming_topk(S, ResamplingPlan.from_counts(counts, "subsample"), int(ks_arr.max()), ranking,
                              row_seeds(rng, counts.shape[0]))
    a, b = state.idx[0::2], state.idx[1::2]
    out = []
    for k in ks_arr:
        inter = np.array([np.intersect1d(x[:k], y[:k]).size for x, y in zip(a, b)], dtype=np.float64)
        j = inter / (2 * k - inter)
        out.append((j.mean(), j.std(ddof=1) / np.sqrt(j.size)))
    return np.array([o[0] for o in out]), np.array([o[1] for o in out])


def _predict_jaccard(S: np.ndarray, sizes: np.ndarray, ks: np.ndarray, *, ranking: str, means: str, n_outer: int,
                     n_sim: int, zp: float, seed: Any) -> dict[str, np.ndarray]:
    """Return [size, k] arrays J, se, plugin, pilot halves' J, low, high: the J_m prediction and its bracket."""
    n0 = S.shape[0]
    c_point, c_outer, c_half = spawn_seeds(as_seed_sequence(seed), 3)
    rng = np.random.default_rng(c_point)
    fit = fit_pilot(S, ranking=ranking, means=means)
    point = np.array([_dataset_jaccard(fit, m, 2 * n_sim, ks, ranking, rng) for m in sizes])  # [m, 2, k]
    plain = fit_pilot(S, ranking=ranking, means="pilot")
    plugin = np.array([_dataset_jaccard(plain, m, 2 * n_sim, ks, ranking, rng)[0] for m in sizes])
    half, half_se = half_jaccard(S, ks, ranking=ranking, seed=c_half)
    se = np.sqrt(_refit_se(S, sizes, ks, ranking, means, n_outer, n_sim, c_outer) + point[:, 1] ** 2)
    J = point[:, 0]
    # J_m >= J_{n0/2} for m >= n0/2: the halves bound J_m from below without extrapolating the pilot's noise
    above = (sizes >= n0 / 2)[:, None]
    below = np.where(above, np.minimum(J, half[None, :]), J)
    low = below - zp * np.where(above & (half[None, :] < J), np.hypot(se, half_se), se)
    high = np.maximum(J, plugin) + zp * se
    return {"J": J, "se": se, "plugin": plugin, "half": np.broadcast_to(half, J.shape),
            "low": np.clip(low, 0, 1), "high": np.clip(high, 0, 1)}


def predict_stability(S: np.ndarray, ns: Sequence[int], ks: Sequence[int], *, ranking: str, seed: Any = None,
                      means: str = "tested", n_outer: int = 40, n_sim: int = 50,
                      prediction_level: float = 0.9) -> dict[str, np.ndarray]:
    """Return per (n, k) the predicted data-level Jaccards J_{n/2} (primary) and J_n of the top-k circuit, with errors.

    J_m is E[Jaccard(top-k of D1, top-k of D2)] for two independent datasets of m prompts. The primary,
    jaccard_half, is J_{floor(n/2)}: what an audit of n prompts reports as jaccard_half (the mean over random
    splits of its n prompts into two disjoint halves of floor(n/2), which are two independent datasets of that
    size, so its expectation is J_{floor(n/2)} exactly; circuitstat.stats.stability_halves). Columns: n, k,
    half_units (floor(n/2), the units in each half: prompts, or templates where n counts templates, as the
    audit's jaccard_half_units), jaccard_half with jaccard_half_se, jaccard_half_plugin, jaccard_half_pi_low /
    jaccard_half_pi_high; the same for J_n (an extrapolation, as the audit's jaccard_data is): jaccard,
    jaccard_se, jaccard_plugin, jaccard_pi_low / jaccard_pi_high; jaccard_pilot_halves (J between disjoint
    halves of the pilot: unbiased for J at n0/2, the bracket's lower end for every m >= n0/2) and
    jaccard_chance (two random k-sets); pilot_homogeneity_p (``homogeneity_pvalue`` of the pilot) and means_tied
    (``means="tested"`` found no edge told apart, so the model's means are all c). Each J_m is the model fitted to the pilot (2 n_sim simulated datasets
    of m), its se the spread over n_outer bootstrap refits of the pilot (Monte Carlo part removed), its
    plugin the same from the pilot's plain means, and its interval [min(J, pilot halves) - z se,
    max(J, plugin) + z se] at prediction_level (clipped to [0, 1]). See the module docstring.
    """
    S, ns_arr = check_pilot(S, ns, prediction_level=prediction_level)
    E = S.shape[1]
    ks_arr = _check_ks(ks, E)
    if int(n_outer) < 10 or int(n_sim) < 10:
        raise InputError(f"n_outer = {n_outer} and n_sim = {n_sim} must both be at least 10 (the prediction's "
                         "error is their spread)")
    halves = ns_arr // 2
    sizes = np.unique(np.concatenate([ns_arr, halves]))  # J_n and J_{n/2} share sizes where one n is another's half
    pred = _predict_jaccard(S, sizes, ks_arr, ranking=ranking, means=means, n_outer=n_outer, n_sim=n_sim,
                            zp=float(ndtri(0.5 + prediction_level / 2)), seed=seed)
    at_n, at_half = np.searchsorted(sizes, ns_arr), np.searchsorted(sizes, halves)
    nn, kk = np.meshgrid(ns_arr, ks_arr, indexing="ij")
    chance = np.broadcast_to(np.asarray(chance_jaccard(E, ks_arr), dtype=np.float64), nn.shape)
    out = {"n": nn.ravel(), "k": kk.ravel(), "half_units": (nn // 2).ravel()}
    for prefix, rows in (("jaccard_half", at_half), ("jaccard", at_n)):
        out.update({prefix: pred["J"][rows].ravel(), f"{prefix}_se": pred["se"][rows].ravel(),
                    f"{prefix}_plugin": pred["plugin"][rows].ravel(), f"{prefix}_pi_low": pred["low"][rows].ravel(),
                    f"{prefix}_pi_high": pred["high"][rows].ravel()})
    out.update(jaccard_pilot_halves=pred["half"][at_n].ravel(), jaccard_chance=chance.ravel())
    p = homogeneity_pvalue(S.mean(axis=0), S.std(axis=0, ddof=1), S.shape[0], ranking)
    out.update(pilot_homogeneity_p=np.full(nn.size, p),
               means_tied=np.full(nn.size, means == "tested" and p > HOMOGENEITY_LEVEL))
    return out


def simulated_datasets(S: np.ndarray, n: int, n_datasets: int, *, ranking: str, seed: Any = None,
                       means: str = "tested") -> Iterator[np.ndarray]:
    """Yield n_datasets simulated datasets [n, E], each drawn from the model refitted to a bootstrap resample
    of the pilot's rows (so the pilot's own uncertainty is part of every probability computed over them)."""
    S = np.asarray(S, dtype=np.float64)
    n0 = S.shape[0]
    c_plan, c_rows = spawn_seeds(as_seed_sequence(seed), 2)
    plan = ResamplingPlan.bootstrap(n0, int(n_datasets), c_plan)
    rng = np.random.default_rng(c_rows)
    for d in range(int(n_datasets)):
        fit = fit_pilot(S[plan.indices(d)], ranking=ranking, means=means)
        yield fit.dataset(rng.integers(0, n0, int(n)), rng)


def clear_probability(S: np.ndarray, n: int, ks: Sequence[int], target: float, *, ranking: str,
                      n_datasets: int = 20, seed: Any = None, means: str = "tested",
                      **stability: Any) -> dict[str, np.ndarray]:
    """Return per k the chance that a dataset of n prompts gives jaccard_data_ci_low >= target, with its MC error.

    Each of n_datasets simulated datasets (simulated_datasets) is run through circuit_stability with
    data-level intervals (``stability``: its options, e.g. n_resamples, n_outer, n_inner).
    """
    from .stability import circuit_stability
    from .stability_data import MIN_OBS

    S, _ = check_pilot(S, [n])
    ks_arr = _check_ks(ks, S.shape[1])
    if int(n) < MIN_OBS:
        raise InputError(f"the data-level interval needs N >= {MIN_OBS}; predict its chance at N >= {MIN_OBS}")
    if not 0 <= target <= 1:
        raise InputError(f"the Jaccard target must lie in [0, 1], got {target}")
    c_data, c_stab = spawn_seeds(as_seed_sequence(seed), 2)
    seeds = spawn_seeds(c_stab, int(n_datasets))
    lows = np.array([circuit_stability(D, ks=ks_arr, ranking=ranking, seed=seeds[d], data_level=True,
                                       **stability).per_k["jaccard_data_ci_low"]
                     for d, D in enumerate(simulated_datasets(S, n, n_datasets, ranking=ranking, seed=c_data,
                                                              means=means))])
    p = (lows >= target).mean(axis=0)
    return {"n": np.full(ks_arr.size, int(n)), "k": ks_arr, "p_clear": p,
            "p_clear_se": np.sqrt(p * (1 - p) / int(n_datasets)), "n_datasets": np.full(ks_arr.size, int(n_datasets))}
