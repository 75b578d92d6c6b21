"""PPI++ for per-edge means: the mean exact effect from an approximation on every prompt plus exact on a few.

Notation (Angelopoulos, Duchi & Zrnic 2023, "PPI++: Efficient Prediction-Powered Inference",
arXiv 2311.01453, section 2 and Example 1): ``Y`` [n, E] exact scores and ``Yhat`` [n, E] the
approximation's scores on the n labelled prompts, ``Yhat_u`` [N_u, E] the approximation on the N_u
unlabelled prompts, drawn independently of the labelled ones from the same prompt distribution.
Per edge (column), with a power-tuning weight λ:

    θ̂_λ = λ · mean(Yhat_u) + mean(Y − λ · Yhat)               (the rectified estimate, eq. 2 / Example 1)
    SE²  = λ² · Var(Yhat_u) / N_u + Var(Y − λ · Yhat) / n          (its plug-in variance)
    λ̂   = Cov(Y, Yhat) / ((1 + n / N_u) · Var(Yhat)),  clipped to [0, 1]

λ̂ minimises the estimated variance (PPI++ eq. 6 specialised to the mean, whose Hessian is the
identity). The reference implementation, ppi_py 0.2.3 (``ppi_mean_ci``, ``ppi_mean_pointestimate`` and
``_calc_lam_glm`` in ppi_py/ppi.py; github.com/aangelopoulos/ppi_py), takes Var(Yhat) over the labelled
and unlabelled approximations pooled (divisor n + N_u − 1), Cov with divisor n, the SE's variances with
divisors n and N_u, and clips λ to [0, 1]; ``tuning="pooled"`` with ``interval="z"`` reproduces it to
rounding with λ per edge (ppi_py's ``lam_optim_mode="element"``). An edge whose approximation is
constant gets λ = 0 (ppi_py: 0/0).

Small n (8-32 labelled prompts) under heavy tails is where that form fails; the defaults here are the
forms the coverage study chose (circuitstat.stats.verified.coverage; docs/verified.md): see ``TUNINGS`` and
``INTERVALS``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special

from circuitstat.core.errors import InputError

from .reliability import approx_tail_share

__all__ = ["PPIFit", "max_sample_kurtosis", "kurtosis_floor_cap", "column_excess_kurtosis", "sd_without_extreme",
           "regression_sd", "yardstick_sd",
           "TUNINGS", "DEFAULT_TUNING", "INTERVALS", "DEFAULT_INTERVAL", "power_tuning", "ppi_fit", "ppi_intervals",
           "check_ppi_inputs"]

#: how λ's variance term is estimated: "pooled" (ppi_py: labelled and unlabelled approximations together)
#: or "labelled" (the labelled prompts only, the sample Cov(Y, Yhat) comes from: the slope of the
#: two-phase regression estimator, Cochran 1977, Sampling Techniques, §12.6). Under heavy tails at small
#: n they differ sharply: a labelled set without the approximation's rare large prompts has a tiny Cov
#: while the pooled variance includes those prompts, so the pooled λ̂ collapses to ~0 on exactly the
#: edges where the approximation tracks exact best (zoo: per-example correlation 0.99, median λ̂ 0.03)
#: and the estimate becomes the mean of n exact scores, which misses the rare prompts.
TUNINGS = ("pooled", "labelled")
DEFAULT_TUNING = "labelled"

#: interval forms. "z": ppi_py's normal interval (divisor-n variances). "t": unbiased variances and
#: Student-t quantiles with Welch-Satterthwaite degrees of freedom (about n − 1). "t2": a tuned λ costs
#: the rectifier one degree of freedom (divisor n − 2, about n − 2 df, as the two-phase regression
#: estimator). "tk": t2 with the rectifier's df lowered by its sample excess kurtosis (``_kurtosis_df``).
#: "tka": tk with that kurtosis at least the approximation's own over the unlabelled prompts (a sample
#: of n cannot show a heavy tail; N_u prompts of the approximation can, and the rectifier of an edge
#: whose approximation is heavy-tailed is heavy-tailed too on every population measured). "tkb": tka with
#: that floor bounded so that the rectifier's df stay at least 2 (``kurtosis_floor_cap``): the floor stands in
#: for the tail the labelled sample missed, but below 2 df Student's t has no variance and its quantile
#: explodes (tka's fell below 1 df for approximations with excess kurtosis > 30 at n = 16, up to 4e17 times exact
#: on all N: issue 48). The rectifier's own sample kurtosis never reaches the cap (a sample of n has at most
#: ``max_sample_kurtosis(n)``), so only the borrowed floor is bounded.
INTERVALS = ("z", "t", "t2", "tk", "tka", "tkb")
DEFAULT_INTERVAL = "tkb"


@dataclass
class PPIFit:
    """Per-edge pieces of a PPI++ fit ([E] each unless noted): what every interval form is built from."""

    estimate: np.ndarray
    lam: np.ndarray
    imputed_mean: np.ndarray      # mean(Yhat_u)
    imputed_var: np.ndarray       # Var(Yhat_u), divisor N_u − 1
    imputed_kurtosis: np.ndarray  # excess kurtosis of Yhat_u
    approx_tail_share: np.ndarray  # reliability.approx_tail_share of Yhat_u (for the reliability flag)
    rectifier: np.ndarray         # Y − λ Yhat on the labelled prompts [n, E]
    n: int
    n_unlabelled: int
    tuned: bool                   # λ estimated from the data (False: given)
    tuning: str
    exact_ref_sd: np.ndarray | None = None  # the flag's yardstick SD of Y (``yardstick_sd``)
    n_coefficients: int = 1       # coefficients a tuned fit estimated per edge (one df each; stats/verified/multi.py: p)
    exact_sd: np.ndarray | None = None  # plain SD of Y on the labelled prompts (the certain exact-on-all-N bound's)


def _pooled_var(Yhat: np.ndarray, Yhat_u: np.ndarray) -> np.ndarray:
    """Return the variance (divisor n + N_u − 1) of the labelled and unlabelled approximations pooled."""
    n, N = Yhat.shape[0], Yhat_u.shape[0]
    mh, mu = Yhat.mean(0), Yhat_u.mean(0)
    m = (n * mh + N * mu) / (n + N)
    ss = ((Yhat - mh) ** 2).sum(0) + ((Yhat_u - mu) ** 2).sum(0) + n * (mh - m) ** 2 + N * (mu - m) ** 2
    return ss / (n + N - 1)


def power_tuning(Y: np.ndarray, Yhat: np.ndarray, Yhat_u: np.ndarray, clip: bool = True,
                 tuning: str = "pooled") -> np.ndarray:
    """Return the per-edge PPI++ weight λ̂ [E] (``tuning="pooled"``: ppi_py's ``_calc_lam_glm``, element mode)."""
    if tuning not in TUNINGS:
        raise InputError(f"unknown tuning {tuning!r}; use one of {', '.join(TUNINGS)}")
    n, N = Y.shape[0], Yhat_u.shape[0]
    hc = Yhat - Yhat.mean(0)
    cov = ((Y - Y.mean(0)) * hc).sum(0) / n
    var = _pooled_var(Yhat, Yhat_u) if tuning == "pooled" else (hc * hc).sum(0) / n
    with np.errstate(divide="ignore", invalid="ignore"):
        lam = np.where(var > 0, cov / ((1.0 + n / N) * np.where(var > 0, var, 1.0)), 0.0)
    return np.clip(lam, 0.0, 1.0) if clip else lam


def check_ppi_inputs(Y: np.ndarray, Yhat: np.ndarray, Yhat_u: np.ndarray) -> tuple[np.ndarray, ...]:
    """Return the three inputs as float64 [rows, E]; ValueError naming a shape, size or NaN problem."""
    Y, Yhat, Yhat_u = (np.asarray(a, dtype=np.float64) for a in (Y, Yhat, Yhat_u))
    Y, Yhat, Yhat_u = (a[:, None] if a.ndim == 1 else a for a in (Y, Yhat, Yhat_u))
    if Y.ndim != 2 or Y.shape != Yhat.shape or Yhat_u.ndim != 2 or Yhat_u.shape[1] != Y.shape[1]:
        raise InputError(f"need exact [n, E], approx on the same n prompts [n, E] and approx on the unlabelled "
                         f"prompts [N_u, E]; got {Y.shape}, {Yhat.shape}, {Yhat_u.shape}")
    if Y.shape[0] < 4 or Yhat_u.shape[0] < 2:
        raise InputError(f"need at least 4 labelled and 2 unlabelled prompts, got {Y.shape[0]} and "
                         f"{Yhat_u.shape[0]}; verify more prompts")
    for label, a in (("exact", Y), ("approx (labelled)", Yhat), ("approx (unlabelled)", Yhat_u)):
        if not np.isfinite(a).all():
            raise InputError(f"the {label} scores contain NaN or infinite values; drop or recompute those prompts")
    return Y, Yhat, Yhat_u


def column_excess_kurtosis(x: np.ndarray) -> np.ndarray:
    """Return the sample excess kurtosis per column (m4 / m2² − 3; 0 for a constant column)."""
    d = x - x.mean(0)
    m2, m4 = (d**2).mean(0), (d**4).mean(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(m2 > 0, m4 / np.where(m2 > 0, m2, 1.0) ** 2 - 3.0, 0.0)


def sd_without_extreme(Y: np.ndarray) -> np.ndarray:
    """Return per column the SD (ddof 1) of Y [n, E] without its value farthest from the column median."""
    return _drop_extreme(Y)[0].std(1, ddof=1)


def _drop_extreme(Y: np.ndarray, H: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Y [n, E] as [E, n − 1] and H [n, E, p] as [E, n − 1, p], without, per column, the row whose Y is farthest
    from the column median (one rule for the yardstick's two SDs, so both drop the same prompt)."""
    n, E = Y.shape
    far = np.abs(Y - np.median(Y, 0)).argmax(0)
    keep = np.ones(Y.shape, dtype=bool)
    keep[far, np.arange(E)] = False
    Yt = Y.T[keep.T].reshape(E, n - 1)
    Ht = None if H is None else H.transpose(1, 0, 2)[keep.T].reshape(E, n - 1, H.shape[2])
    return Yt, Ht


def regression_sd(Y: np.ndarray, H: np.ndarray, H_all: np.ndarray) -> np.ndarray:
    """Return per column the two-phase regression estimate of SD(Y) on the labelled rows less the most extreme Y.

    Y [n, E] exact on the labelled prompts, H [n, E] (or [n, E, p] for p predictors) the approximation on them,
    H_all [N, E] (or [N, E, p]) on all N prompts. On the n − 1 rows ``sd_without_extreme`` keeps, with β the OLS
    slope of Y on H (intercept included) and variances of divisor (rows − 1):

        s²_reg = [Var(Y) − βᵀ Cov(H) β] + βᵀ Cov_N(H) β

    the double-sampling regression estimator of a variance (Cochran 1977, Sampling Techniques, §12.6; in PPI terms,
    Angelopoulos et al. 2023, "Prediction-powered inference", Science 382, the rectified second moment with
    βᵀ(H − mean H) as the prediction). The bracket is the OLS residual variance, so s²_reg ≥ 0; where the labelled
    rows are over-spread and the approximation tracks exact, βᵀ(Cov_N(H) − Cov(H))β < 0 corrects it. A predictor
    constant on the rows gets slope 0 (pseudo-inverse). Measured as the flag's yardstick in docs/verified.md.
    """
    Y = np.asarray(Y, np.float64)
    H, H_all = (np.asarray(a, np.float64) for a in (H, H_all))
    H, H_all = (a[:, :, None] if a.ndim == 2 else a for a in (H, H_all))
    Yt, Ht = _drop_extreme(Y, H)                       # [E, m], [E, m, p]
    m = Yt.shape[1]
    yc, hc = Yt - Yt.mean(1, keepdims=True), Ht - Ht.mean(1, keepdims=True)
    beta = np.einsum("epq,eq->ep", np.linalg.pinv(np.einsum("emp,emq->epq", hc, hc)),
                     np.einsum("emp,em->ep", hc, yc))
    resid = ((yc - np.einsum("emp,ep->em", hc, beta)) ** 2).sum(1) / (m - 1)
    ha = H_all - H_all.mean(0)
    cov_all = np.einsum("nep,neq->epq", ha, ha) / (H_all.shape[0] - 1)
    return np.sqrt(resid + np.maximum(np.einsum("ep,epq,eq->e", beta, cov_all, beta), 0.0))


def yardstick_sd(Y: np.ndarray, H: np.ndarray, H_all: np.ndarray) -> np.ndarray:
    """Return per column the tail flag's yardstick SD: min(``sd_without_extreme``, ``regression_sd``).

    The smaller of two estimates of SD(Y): the labelled prompts' own (without the most extreme one, so that one
    large prompt cannot widen the yardstick with the interval) and the one that also reads the approximation on all
    N prompts, which shows a labelled sample that is over-spread by chance where the approximation tracks exact
    (docs/verified.md, "A prediction-powered yardstick for the width rule").
    """
    return np.minimum(sd_without_extreme(Y), regression_sd(Y, H, H_all))


def ppi_fit(Y: np.ndarray, Yhat: np.ndarray, Yhat_u: np.ndarray, lam: float | np.ndarray | None = None,
            tuning: str = DEFAULT_TUNING) -> PPIFit:
    """Return the per-edge PPI++ fit (λ̂ per edge unless ``lam`` is given: 1 is plain PPI, 0 exact only)."""
    Y, Yhat, Yhat_u = check_ppi_inputs(Y, Yhat, Yhat_u)
    E, tuned = Y.shape[1], lam is None
    lam = power_tuning(Y, Yhat, Yhat_u, tuning=tuning) if tuned else np.broadcast_to(
        np.asarray(lam, np.float64), (E,)).copy()
    rect = Y - lam * Yhat
    mu = Yhat_u.mean(0)
    return PPIFit(lam * mu + rect.mean(0), lam, mu, Yhat_u.var(0, ddof=1), column_excess_kurtosis(Yhat_u),
                  approx_tail_share(Yhat_u), rect, Y.shape[0], Yhat_u.shape[0], tuned, tuning,
                  yardstick_sd(Y, Yhat, np.concatenate([Yhat, Yhat_u])), exact_sd=Y.std(0, ddof=1))


def max_sample_kurtosis(n: int) -> float:
    """Return the largest sample excess kurtosis (m4 / m2² − 3, divisor n) any sample of n values can have.

    m4 / m2² ≤ n − 2 + 1 / (n − 1), with equality for one value apart from n − 1 equal others (one
    outlier: m4 / m2² = ((n − 1)³ + 1) / (n (n − 1)) = n − 2 + 1 / (n − 1)).
    """
    return n - 5.0 + 1.0 / (n - 1.0)


def kurtosis_floor_cap(n: int, k: int) -> float:
    """Return the excess kurtosis at which ``_kurtosis_df`` gives 2 degrees of freedom: n (1 − 2 / (n − k))."""
    return n * (1.0 - 2.0 / (n - k))


def _kurtosis_df(dev: np.ndarray, m2: np.ndarray, n: int, k: int, floor: np.ndarray | None) -> np.ndarray:
    """Return the rectifier variance's effective degrees of freedom under its excess kurtosis κ.

    The sample variance has Var(s²) ≈ σ⁴ (2 / (n − 1) + κ / n) for any distribution with a finite
    fourth moment (Cramér 1946, Mathematical Methods of Statistics, §27.4); a scaled χ² with the same
    relative variance has df = 2 / (2 / (n − k) + κ / n): n − k at κ = 0, fewer under heavy tails.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = np.where(m2 > 0, n * (dev**4).sum(0) / np.where(m2 > 0, m2, 1.0) ** 2 - 3.0, 0.0)
    if floor is not None:
        kappa = np.maximum(kappa, floor)
    return 2.0 / (2.0 / (n - k) + np.maximum(kappa, 0.0) / n)


def _se_df(fit: PPIFit, method: str) -> tuple[np.ndarray, np.ndarray]:
    """Return (SE, degrees of freedom) per edge of one interval form ("z": df = inf)."""
    n, N = fit.n, fit.n_unlabelled
    dev = fit.rectifier - fit.rectifier.mean(0)
    m2 = (dev**2).sum(0)
    if method == "z":  # ppi_py: variances with divisors N_u and n
        se = np.sqrt(fit.lam**2 * fit.imputed_var * (N - 1) / N / N + m2 / n / n)
        return se, np.full(se.shape, np.inf)
    k = 1 + fit.n_coefficients if (method != "t" and fit.tuned) else 1
    a, b = fit.lam**2 * fit.imputed_var / N, m2 / (n - k) / n
    df_r = np.full(b.shape, float(n - k))
    if method in ("tk", "tka", "tkb"):
        floor = {"tk": None, "tka": fit.imputed_kurtosis,
                 "tkb": np.minimum(fit.imputed_kurtosis, kurtosis_floor_cap(n, k))}[method]
        df_r = np.minimum(df_r, _kurtosis_df(dev, m2, n, k, floor))
    with np.errstate(divide="ignore", invalid="ignore"):  # Welch-Satterthwaite; a constant edge gets df_r
        df = np.where(a + b > 0, (a + b) ** 2 / (a**2 / (N - 1) + b**2 / df_r), df_r)
    return np.sqrt(a + b), df


def ppi_intervals(fit: PPIFit, method: str = DEFAULT_INTERVAL, confidence_level: float = 0.95
                  ) -> dict[str, np.ndarray]:
    """Return {low, high, standard_error, df, pvalue} per edge of one interval form (see ``INTERVALS``).

    The two-sided p-value of mean = 0 inverts the same interval: the interval excludes 0 exactly when
    pvalue < 1 − confidence_level. An edge with SE 0 gets p = 1 at estimate 0, else 0.
    """
    if method not in INTERVALS:
        raise InputError(f"unknown interval {method!r}; use one of {', '.join(INTERVALS)}")
    if not 0.0 < confidence_level < 1.0:
        raise InputError(f"confidence_level must lie in (0, 1), got {confidence_level}")
    alpha = 1.0 - confidence_level
    se, df = _se_df(fit, method)
    with np.errstate(divide="ignore", invalid="ignore"):
        stat = np.abs(fit.estimate) / se
    if method == "z":
        q, pvalue = np.full(se.shape, special.ndtri(1 - alpha / 2)), 2 * special.ndtr(-stat)
    else:
        q, pvalue = special.stdtrit(df, 1 - alpha / 2), 2 * special.stdtr(df, -stat)
    pvalue = np.where(se > 0, pvalue, np.where(fit.estimate == 0, 1.0, 0.0))
    return {"low": fit.estimate - q * se, "high": fit.estimate + q * se, "standard_error": se, "df": df,
            "pvalue": np.minimum(pvalue, 1.0)}
