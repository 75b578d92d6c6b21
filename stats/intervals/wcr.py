"""The restricted wild cluster bootstrap-t (WCR) of a mean, inverted exactly into a confidence set.

Testing H0: mu = mu0 with the null imposed (MacKinnon & Webb 2017, 2018; Roodman, MacKinnon, Nielsen & Webb 2019,
"Fast and wild", the `boottest` default) resamples x*_i = mu0 + w_g (x_i - mu0), one weight w_g per cluster, and
refers t = (mean - mu0) / SE_CR2 to t*_b = (mean*_b - mu0) / SE*_CR2,b. The confidence set is every mu0 that the
symmetric test does not reject: p(mu0) = #{b : |t*_b| >= |t|} / B >= 2 alpha (ties count as extreme).

Derivation for an intercept-only model (x-bar the mean, s = SE_CR2, U_g the residual cluster sums, n_g the
sizes, c_g = 1 / (1 - n_g/N) the CR2 factors of circuitstat.stats.intervals.wild). Write mu0 = x-bar - s tau,
so t = tau, and scale U' = U / s (t* is scale-free). The restricted residual cluster sums are U'_g + n_g tau;
resample b's numerator is A_b + C_b tau with A_b = sum w_g U'_g, C_b = sum w_g n_g, and its residual cluster
sums are alpha_g + tau beta_g with alpha_g = w_g U'_g - n_g A_b/N, beta_g = n_g (w_g - C_b/N), so
    t*_b(tau) = (A_b + C_b tau) / sqrt(P_b + 2 Q_b tau + R_b tau^2),
    P = sum c alpha^2, Q = sum c alpha beta, R = sum c beta^2: a ratio of quadratics in tau.
Resample b is at least as extreme as the data at tau exactly where the quartic
    f_b(tau) = (A_b + C_b tau)^2 - tau^2 (P_b + 2 Q_b tau + R_b tau^2)
is >= 0. f_b(0) = A_b^2 >= 0 and f_b -> -inf (R_b > 0), so each resample is extreme near tau = 0 and not far
out; the count of extreme resamples is a step function whose steps sit at the quartics' real roots. The bound
on each side is the last root at which the count falls below 2 alpha B: the set's hull, so the p-value here
is the largest count at or beyond |tau| on the side (it inverts the hull exactly; where the count is not
monotone, the set itself may have gaps, which the hull covers). Weight vectors with all weights equal give
t*_b = +-t at every tau (f_b = 0): they always count as extreme, so with G = 2 Webb weights (6 of 36) the
set is the whole line, as it should be.

Roots: by Descartes' rule of signs a quartic whose coefficient signs change once has exactly one positive
root; so has one with a negative discriminant (two real roots, and f(0) > 0 > f(+-inf) puts one on each side).
Those (about 98% of resamples) are found by safeguarded Newton in a bracket; the others by the eigenvalues of the
companion matrix. w and -w give the same quartic, so a weight set closed under negation (an enumeration) is
used by half.
"""

from __future__ import annotations

import numpy as np

from .wild import ClusterSums, cr2_se

__all__ = ["wcr_quartics", "wcr_steps", "wcr_bounds_and_pvalues", "wcr_interval", "constant_rows"]

#: edge x weight-vector elements per block of the root finding (its [c, B, 3] and [c, B, 5] arrays stay near 100 MB)
_BLOCK_ELEMENTS = 1_500_000


def constant_rows(w: np.ndarray) -> np.ndarray:
    """Return a mask of the weight rows whose weights are all equal (their t* equals +-t at every mu0)."""
    return np.all(w == w[:, :1], axis=1)


def wcr_quartics(Us: np.ndarray, cs: ClusterSums, w: np.ndarray) -> np.ndarray:
    """Return the quartics f_b(tau) [c, B, 5] (coefficients of tau^4 ... tau^0) of scaled cluster sums Us [c, G]."""
    n, c, N = cs.sizes, 1.0 / (1.0 - cs.h), float(cs.n_obs)
    A = Us @ w.T
    C = w @ n
    K = float((n * n * c).sum())
    Unc = (Us * n * c) @ w.T  # sum c n w U'
    wn2c = w @ (n * n * c)  # sum c n^2 w
    P = (Us * Us * c) @ (w * w).T - 2.0 * (A / N) * Unc + (A / N) ** 2 * K
    Q = (Us * n * c) @ (w * w).T - (C / N) * Unc - (A / N) * wn2c + A * C / N ** 2 * K
    beta = n * (w - (C / N)[:, None])  # [B, G], the same for every edge: summed directly, no cancellation
    R = (beta * beta * c).sum(axis=1)
    Cb = np.broadcast_to(C, A.shape)
    return np.stack([-np.broadcast_to(R, A.shape), -2.0 * Q, Cb * Cb - P, 2.0 * A * Cb, A * A], axis=-1)


def _sign_changes(coef: np.ndarray) -> np.ndarray:
    """Return the number of sign changes of each coefficient row [..., 5], zeros skipped (Descartes)."""
    last = np.zeros(coef.shape[:-1])
    changes = np.zeros(coef.shape[:-1], dtype=np.int64)
    for k in range(coef.shape[-1]):
        s = np.sign(coef[..., k])
        changes += (s != 0) & (last != 0) & (s != last)
        last = np.where(s != 0, s, last)
    return changes


def _horner(coef: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (f(x), f'(x)) of the quartics coef [M, 5] at x [M]."""
    f = coef[:, 0].copy()
    d = np.zeros_like(f)
    for k in range(1, coef.shape[1]):
        d = d * x + f
        f = f * x + coef[:, k]
    return f, d


def _single_positive_root(coef: np.ndarray) -> np.ndarray:
    """Return the one positive root of quartics [M, 5] with f(0) > 0, leading coefficient < 0 and one sign change.

    Safeguarded Newton: the bracket [lo, hi] (f(lo) > 0 > f(hi), hi from Fujiwara's bound on the roots' moduli)
    shrinks every step, and a Newton step that leaves it is replaced by bisection; converged rows drop out."""
    m = coef.shape[0]
    ratio = np.abs(coef[:, 1:] / coef[:, :1]) * np.array([1.0, 1.0, 1.0, 0.5])
    hi = 2.0 * np.max(ratio ** (1.0 / np.arange(1, 5)), axis=1)
    lo = np.zeros(m)
    x = 0.5 * hi
    out = np.empty(m)
    act = np.arange(m)
    cf = coef
    for _ in range(200):
        f, d = _horner(cf, x)
        pos = f > 0
        lo = np.where(pos, x, lo)
        hi = np.where(pos, hi, x)
        with np.errstate(divide="ignore", invalid="ignore"):
            nx = x - f / d
        ok = np.isfinite(nx) & (nx > lo) & (nx < hi)
        nx = np.where(f == 0, x, np.where(ok, nx, 0.5 * (lo + hi)))  # f = 0: x is the root
        done = (np.abs(nx - x) <= 1e-14 * np.abs(nx)) | (hi - lo <= 1e-15 * hi)
        out[act[done]] = nx[done]
        keep = ~done
        act, cf, x, lo, hi = act[keep], cf[keep], nx[keep], lo[keep], hi[keep]
        if not act.size:
            break
    out[act] = x
    return out


def _positive_roots_general(coef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (roots [M, 3], steps [M, 3]) of quartics [M, 5]: their positive real roots (inf where fewer) and
    the change of f's sign there (+1 where f turns non-negative, -1 where it turns negative, by f')."""
    m = coef.shape[0]
    roots = np.full((m, 4), np.inf)
    steps = np.zeros((m, 4))
    if m:
        comp = np.zeros((m, 4, 4))
        comp[:, 0, :] = -coef[:, 1:] / coef[:, :1]
        comp[:, 1, 0] = comp[:, 2, 1] = comp[:, 3, 2] = 1.0
        ev = np.linalg.eigvals(comp)
        real = (np.abs(ev.imag) <= 1e-7 * np.maximum(1.0, np.abs(ev.real))) & (ev.real > 0)
        r = np.where(real, ev.real, np.inf)
        for k in range(4):
            _, d = _horner(coef, np.where(np.isfinite(r[:, k]), r[:, k], 0.0))
            steps[:, k] = np.where(np.isfinite(r[:, k]), np.sign(d), 0.0)
        roots = r
    order = np.argsort(roots, axis=1)
    roots, steps = np.take_along_axis(roots, order, 1), np.take_along_axis(steps, order, 1)
    return roots[:, :3], steps[:, :3]


def _discriminant(coef: np.ndarray) -> np.ndarray:
    """Return the discriminant of quartics [M, 5] (negative: exactly two real roots)."""
    a, b, c, d, e = (coef[:, k] for k in range(5))
    a2, b2, c2, d2, e2 = a * a, b * b, c * c, d * d, e * e  # products, not float powers (several times faster)
    return (256 * a2 * a * e2 * e - 192 * a2 * b * d * e2 - 128 * a2 * c2 * e2 + 144 * a2 * c * d2 * e
            - 27 * a2 * d2 * d2 + 144 * a * b2 * c * e2 - 6 * a * b2 * d2 * e - 80 * a * b * c2 * d * e
            + 18 * a * b * c * d2 * d + 16 * a * c2 * c2 * e - 4 * a * c2 * c * d2 - 27 * b2 * b2 * e2
            + 18 * b2 * b * c * d * e - 4 * b2 * b * d2 * d - 4 * b2 * c2 * c * e + b2 * c2 * d2)


def _status_near_zero(coef: np.ndarray) -> np.ndarray:
    """Return 1 where f >= 0 just right of 0 (the sign of the lowest-order non-zero coefficient), else 0."""
    out = np.zeros(coef.shape[:-1])
    found = np.zeros(coef.shape[:-1], dtype=bool)
    for k in range(coef.shape[-1] - 1, -1, -1):
        nz = (coef[..., k] != 0) & ~found
        out = np.where(nz, coef[..., k] > 0, out)
        found |= nz
    return np.where(found, out, 1.0)  # f == 0 everywhere: a tie at every tau, extreme


def wcr_steps(coef: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (roots [c, M], steps [c, M], count just right of 0 [c]) of the extreme-resample count on tau > 0
    (M between B and 3B; inf roots with step 0 pad the rows)."""
    c, b = coef.shape[:2]
    flat = coef.reshape(c * b, 5)
    roots = np.full((c * b, 3), np.inf)
    steps = np.zeros((c * b, 3))
    ends = (flat[:, 4] > 0) & (flat[:, 0] < 0)
    single = ends & (_sign_changes(flat) == 1)
    # three sign changes and a negative discriminant: two real roots, and f(0) > 0 > f(+-inf) puts one on each side
    single[ends & ~single] = _discriminant(flat[ends & ~single]) < 0
    roots[single, 0] = _single_positive_root(flat[single])
    steps[single, 0] = -1.0
    rest = ~single & (flat[:, 0] < 0)  # all-equal weights (f = 0) have no roots: extreme throughout
    roots[rest], steps[rest] = _positive_roots_general(flat[rest])
    roots, steps = roots.reshape(c, b, 3), steps.reshape(c, b, 3)
    # second and third roots exist only for the few quartics solved by eigenvalues: keep as many columns of
    # them as the edge with most needs (the rest are inf with step 0), so the sort runs over about B events
    extra_r, extra_s = roots[:, :, 1:].reshape(c, 2 * b), steps[:, :, 1:].reshape(c, 2 * b)
    k = int(np.isfinite(extra_r).sum(axis=1).max()) if c else 0
    if k < 2 * b:
        part = np.argpartition(extra_r, k, axis=1)[:, :k]
        extra_r, extra_s = np.take_along_axis(extra_r, part, 1), np.take_along_axis(extra_s, part, 1)
    return (np.concatenate([roots[:, :, 0], extra_r], axis=1), np.concatenate([steps[:, :, 0], extra_s], axis=1),
            _status_near_zero(coef).sum(axis=1))


def _side(coef: np.ndarray, need: float, tau0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (bound, hull count at tau0) on tau > 0: the last root at which the count is >= need just
    before it (inf if it never falls below), and the largest count at or beyond tau0 [c]."""
    roots, steps, base = wcr_steps(coef)
    order = np.argsort(roots, axis=1, kind="stable")
    roots, steps = np.take_along_axis(roots, order, 1), np.take_along_axis(steps, order, 1)
    before = base[:, None] + np.cumsum(steps, axis=1) - steps  # the count on each root's left (closed there)
    final = base + steps.sum(axis=1)
    ok = before >= need
    last = roots.shape[1] - 1 - np.argmax(ok[:, ::-1], axis=1)
    bound = np.where(ok.any(axis=1), roots[np.arange(roots.shape[0]), last], 0.0)
    bound = np.where(final >= need, np.inf, bound)
    suffix = np.maximum.accumulate(np.concatenate([before, final[:, None]], axis=1)[:, ::-1], axis=1)[:, ::-1]
    k = (roots < tau0[:, None]).sum(axis=1)
    return bound, suffix[np.arange(roots.shape[0]), k]


def wcr_bounds_and_pvalues(U: np.ndarray, cs: ClusterSums, w: np.ndarray, alpha: float, theta: np.ndarray,
                           null: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (low, high, symmetric p-value at `null`) of the inverted WCR test for residual cluster sums U [c, G].

    low/high bound the set of mu0 with p(mu0) >= 2 alpha (alpha the tail level: 0.025 for a two-sided 95%
    interval); the p-value is the hull's, so the interval excludes `null` exactly when p < 2 alpha."""
    se = cr2_se(U, cs)
    w = np.asarray(w, dtype=np.float64)
    if _closed_under_negation(w):
        w = w[_first_positive(w)]  # w and -w give the same quartic
    b = w.shape[0]
    need = np.ceil(2.0 * alpha * b - 1e-9)
    n_const = float(constant_rows(w).sum())
    live = w[~constant_rows(w)]
    low, high, p = theta.copy(), theta.copy(), np.ones(theta.shape)
    pos = se > 0  # SE 0: every mu0 but the mean is rejected at any level
    step = max(1, _BLOCK_ELEMENTS // max(1, live.shape[0]))
    idx = np.flatnonzero(pos)
    for j in range(0, idx.size, step):
        sl = idx[j:j + step]
        Us = U[sl] / se[sl, None]
        coef = wcr_quartics(Us, cs, live)
        tau0 = (theta[sl] - null) / se[sl]
        right, cnt_r = _side(coef, need - n_const, np.abs(tau0))
        flip = coef * np.array([1.0, -1.0, 1.0, -1.0, 1.0])  # f(-tau)
        left, cnt_l = _side(flip, need - n_const, np.abs(tau0))
        low[sl] = theta[sl] - se[sl] * right
        high[sl] = theta[sl] + se[sl] * left
        p[sl] = (np.where(tau0 >= 0, cnt_r, cnt_l) + n_const) / b
    p = np.where(pos, p, np.where(theta == null, 1.0, 0.0))
    return low, high, np.minimum(p, 1.0)


def _first_positive(w: np.ndarray) -> np.ndarray:
    """Mask of rows whose first non-zero weight is positive (one of each pair w, -w)."""
    first = w[np.arange(w.shape[0]), np.argmax(w != 0, axis=1)]
    return first > 0


def _closed_under_negation(w: np.ndarray) -> bool:
    """True when the weight rows are a set closed under w -> -w with each row once (an enumeration)."""
    if w.shape[0] % 2:
        return False
    keys = {r.tobytes() for r in w}
    return len(keys) == w.shape[0] and all((-r + 0.0).tobytes() in keys for r in w)


def wcr_interval(U: np.ndarray, cs: ClusterSums, w: np.ndarray, theta: np.ndarray, alpha: float,
                 alternative: str) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """Return ((low, high), p-value at 0) of the inverted WCR test with tail level alpha and `alternative`.

    The weights are symmetric (w and -w equally likely), so t*'s distribution is too and a one-sided bound at
    tail level alpha is the two-sided set's bound at 2 alpha: both use p(mu0) >= 2 alpha, and the one-sided
    p-value is half the symmetric one on the alternative's side."""
    low, high, p = wcr_bounds_and_pvalues(U, cs, w, alpha, theta)
    p = np.maximum(p, 1.0 / (w.shape[0] + 1.0))  # never below the resampling floor 1/(B+1)
    if alternative == "two-sided":
        return (low, high), p
    right = theta > 0 if alternative == "greater" else theta < 0
    p1 = np.where(right, p / 2.0, 1.0 - p / 2.0)
    if alternative == "less":
        low = np.full_like(low, -np.inf)
    else:
        high = np.full_like(high, np.inf)
    return (low, high), p1
