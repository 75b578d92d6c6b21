"""Validation of circuitstat.stats.sample_size: predicted against realised width and Jaccard on known populations.

For each population (a finite score matrix whose every estimand is known) and each of R pilots of n0 rows
drawn from it: predict at each N the per-edge interval width (with its prediction interval) and the expected
data-level Jaccards of the top-k circuit, J_{N/2} (the primary: what an audit of N prompts reports as
jaccard_half) and J_N, each with its stated error; then realise at N by simulation from the population: one
dataset of N per pilot run through the default per-edge interval (bootstrap_edges), and the true J_{N/2} and J_N
from n_truth datasets of N // 2 and of N. Prints, per population and N, how often the realised width fell inside
its prediction interval (pooled over edges and pilots, and the worst edge over pilots), how often it fell at or
under the upper bound width_upper and the median realised / upper, the share of (pilot, edge) whose bound is
uninformative (width_upper_below_pilot false: not below the pilot's own width) and the bound's coverage on the
informative cells against all (SEs over pilots), and, per (N, k), how
often the true J_N fell inside the prediction's interval and how wide that interval was on average, the mean
predicted and true J_N, and the stated error beside the realised RMS error. Output recorded in
docs/sample-size.md.

    OMP_NUM_THREADS=1 nice python bench/sample_size.py [--pilots 100] [--n0 32] [--quick] [--widths-only]
        [--held-out] [--only NAME]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from circuitstat.stats.intervals import bootstrap_edges  # noqa: E402
from circuitstat.stats.populations import spiky_population  # noqa: E402
from circuitstat.stats.pilot_model import MEANS  # noqa: E402
from circuitstat.stats.sample_size import expected_jaccard, predict_stability, predict_widths  # noqa: E402


def populations() -> dict[str, np.ndarray]:
    """The known populations: real exact zoo scores, the planted models' exact scores, a spiky one, a normal one."""
    from fixture_populations import PLANTED_VERIFIED_FIXTURE, load_planted_pair, load_zoo_fixture

    zoo, _ = load_zoo_fixture()
    p3, _, _ = load_planted_pair()
    p5, _, _ = load_planted_pair(PLANTED_VERIFIED_FIXTURE.with_name("groundtruth-verified-planted5.parquet"))
    return {"zoo-induction-exact": zoo, "planted3-exact": p3, "planted5-exact": p5,
            "spiky(2000, 80, seed 9)": spiky_population(2000, 80, seed=9),
            "normal(4000, 40)": np.random.default_rng(4).normal(0.0, 1.0, (4000, 40))}


def held_out() -> dict[str, np.ndarray]:
    """Populations the upper width bound was not chosen on: another spiky seed, the tails and verified next-token
    models' exact scores, and a spike-free heavy-tailed family (lognormal and Student-t(2.5) edges, added for
    issue 49 item 3 and used for no choice)."""
    from fixture_populations import ZOO_FIXTURE, load_planted_pair, load_zoo_fixture

    from circuitstat.stats.populations import smooth_tail_population

    tails, _ = load_zoo_fixture(ZOO_FIXTURE.with_name("tails-mlp3l-induction-exact.parquet"))
    rot, _ = load_zoo_fixture(ZOO_FIXTURE.with_name("tails-mlp4l-rotary-induction-exact.parquet"))
    nt, _, _ = load_planted_pair(ZOO_FIXTURE.with_name("verified-mlp4l-nexttoken.parquet"))
    return {"spiky(2000, 80, seed 21) (held out)": spiky_population(2000, 80, seed=21),
            "tails-mlp3l-exact (held out)": tails, "tails-mlp4l-rotary-exact (held out)": rot,
            "verified-mlp4l-nexttoken (held out)": nt,
            "smooth-tail(2000, 80, seed 49) (held out)": smooth_tail_population(2000, 80, seed=49)}


def fresh() -> dict[str, np.ndarray]:
    """Populations built for issue 49's third round and used for no choice: the mlp3l and mlp3ls next-token models'
    exact scores (never read by this bench before), smooth tails seed 50 and spiky seed 33."""
    from fixture_populations import ZOO_FIXTURE, load_planted_pair

    from circuitstat.stats.populations import smooth_tail_population

    m3, _, _ = load_planted_pair(ZOO_FIXTURE.with_name("verified-mlp3l-nexttoken.parquet"))
    m3s, _, _ = load_planted_pair(ZOO_FIXTURE.with_name("verified-mlp3ls-nexttoken.parquet"))
    return {"mlp3l-nexttoken (fresh)": m3, "mlp3ls-nexttoken (fresh)": m3s,
            "smooth-tail seed 50 (fresh)": smooth_tail_population(2000, 80, seed=50),
            "spiky seed 33 (fresh)": spiky_population(2000, 80, seed=33)}


def study(P: np.ndarray, *, n0: int, ns: list[int], ks: list[int], pilots: int, ranking: str, seed: int,
          means: str = "deconvolved", n_truth: int = 400, n_outer: int = 40, n_sim: int = 50,
          level: float = 0.9, n_resamples: int = 999, widths_only: bool = False) -> dict:
    """Return the per-pilot predictions and realisations of one population."""
    ss = np.random.SeedSequence(seed)
    c_truth, c_pilots = ss.spawn(2)
    sizes = [m for n in ns for m in (n // 2, n)]  # J_{N/2} and J_N of each N
    truth = None if widths_only else np.array([expected_jaccard(P, m, ks, ranking=ranking, n_datasets=n_truth,
                                                                seed=c)[0] for m, c in zip(sizes, c_truth.spawn(len(sizes)))
                                               ]).reshape(len(ns), 2, len(ks))
    inside_w = np.zeros((len(ns), P.shape[1]))
    under_up = np.zeros((len(ns), P.shape[1]))
    ratio, up_ratio, up_pilot = [[] for _ in ns], [[] for _ in ns], [[] for _ in ns]
    # per pilot and N: edges whose bound is informative (below the pilot's own width), and of those and of all,
    # how many held; the pilot is the unit of the shares' SEs
    inf_n, inf_held, all_held = (np.zeros((pilots, len(ns))) for _ in range(3))
    j_pred = np.zeros((pilots, len(ns), 2, len(ks)))  # [.., 0, ..]: J_{N/2}, [.., 1, ..]: J_N
    j_se = np.zeros_like(j_pred)
    j_in = np.zeros_like(j_pred, dtype=bool)
    j_width = np.zeros_like(j_pred)
    for r, c in enumerate(c_pilots.spawn(pilots)):
        c_rows, c_w, c_j, c_real = c.spawn(4)
        rng = np.random.default_rng(c_rows)
        pilot = P[rng.integers(0, P.shape[0], n0)]
        w = predict_widths(pilot, ns, prediction_level=level, n_resamples=n_resamples, seed=c_w)
        st = None if widths_only else predict_stability(pilot, ns, ks, ranking=ranking, seed=c_j, means=means,
                                                        n_outer=n_outer, n_sim=n_sim, prediction_level=level)
        rr = np.random.default_rng(c_real)
        for i, n in enumerate(ns):
            D = P[rr.integers(0, P.shape[0], n)]
            b = bootstrap_edges(D, n_resamples=n_resamples, seed=int(rr.integers(2**63)))
            real = np.asarray(b.confidence_interval.high) - np.asarray(b.confidence_interval.low)
            sel = w["n"] == n
            inside_w[i] += (real >= w["width_pi_low"][sel]) & (real <= w["width_pi_high"][sel])
            ok = w["width"][sel] > 0
            ratio[i].append(np.median(real[ok] / w["width"][sel][ok]))
            under_up[i] += real <= w["width_upper"][sel]
            up_pilot[i].append(np.mean(real <= w["width_upper"][sel]))
            up_ratio[i].append(np.median(real[ok] / w["width_upper"][sel][ok]))
            inf = w["width_upper_below_pilot"][sel]
            held = real <= w["width_upper"][sel]
            inf_n[r, i], inf_held[r, i], all_held[r, i] = inf.sum(), (held & inf).sum(), held.sum()
        if widths_only:
            continue
        for h, col in enumerate(("jaccard_half", "jaccard")):
            shape = (len(ns), len(ks))
            lo, hi = st[f"{col}_pi_low"].reshape(shape), st[f"{col}_pi_high"].reshape(shape)
            j_pred[r, :, h], j_se[r, :, h] = st[col].reshape(shape), st[f"{col}_se"].reshape(shape)
            j_width[r, :, h] = hi - lo
            j_in[r, :, h] = (truth[:, h] >= lo) & (truth[:, h] <= hi)
    return {"truth": truth, "width_cover": inside_w / pilots, "width_ratio": [np.median(x) for x in ratio],
            "upper_cover": under_up / pilots, "upper_ratio": [np.median(x) for x in up_ratio],
            # the pooled share's MC SE with the pilot as the unit (its edges are not independent)
            "upper_se": [np.std(x, ddof=1) / np.sqrt(len(x)) for x in up_pilot],
            "inf_n": inf_n, "inf_held": inf_held, "all_held": all_held, "n_edges": P.shape[1],
            "j_pred": j_pred, "j_se": j_se, "j_in": j_in, "j_width": j_width}


def ratio_se(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Return (sum a / sum b, its SE with the pilot as the unit): the ratio estimator's linearised SE over pilots."""
    r = a.sum() / b.sum()
    m = a.size
    return float(r), float(np.sqrt(np.sum((a - r * b) ** 2) / (m * (m - 1))) / b.mean())


def informative_rows(out: dict, ns: list[int]) -> None:
    """Print, per N, the share of (pilot, edge) whose bound is uninformative (width_upper >= pilot_width), and the
    bound's coverage on the informative cells against all, each with its SE over pilots."""
    E = out["n_edges"]
    print("  bound  N     uninformative (SE)  pilots with any  holds on informative (SE)  holds on all (SE)")
    for i, n in enumerate(ns):
        unin = 1.0 - out["inf_n"][:, i] / E
        b = out["inf_n"][:, i]
        hi, hi_se = ratio_se(out["inf_held"][:, i], b) if b.sum() > 0 else (float("nan"), float("nan"))
        ha, ha_se = ratio_se(out["all_held"][:, i], np.full(b.size, float(E)))
        print(f"         {n:<5} {unin.mean():.3f} ({unin.std(ddof=1) / np.sqrt(unin.size):.3f})       "
              f"{np.mean(unin > 0):.2f}             {hi:.3f} ({hi_se:.3f})              {ha:.3f} ({ha_se:.3f})")


def report(name: str, out: dict, ns: list[int], ks: list[int], pilots: int, level: float) -> None:
    """Print the population's rows."""
    mc = np.sqrt(level * (1 - level) / pilots)
    print(f"\n{name}: {pilots} pilots, nominal {level:.2f} (binomial MC SE {mc:.3f})")
    print("  width  N     pooled  worst-edge  edges<0.80  median realised/predicted  upper bound holds (SE)  "
          "worst edge  median realised/upper")
    for i, n in enumerate(ns):
        c, u = out["width_cover"][i], out["upper_cover"][i]
        print(f"         {n:<5} {c.mean():.3f}   {c.min():.3f}       {np.mean(c < 0.80):.2f}        "
              f"{out['width_ratio'][i]:.3f}                      {u.mean():.3f} ({out['upper_se'][i]:.3f})       "
              f"    {u.min():.3f}       {out['upper_ratio'][i]:.3f}")
    informative_rows(out, ns)
    if out["truth"] is None:
        return
    for h, what in enumerate(("J_N/2", "J_N  ")):
        print(f"  {what}  N     k    true    mean pred  bias     stated SE  RMS error  PI covers  mean PI width")
        for i, n in enumerate(ns):
            for j, k in enumerate(ks):
                pred, true = out["j_pred"][:, i, h, j], out["truth"][i, h, j]
                print(f"         {n:<5} {k:<4} {true:.3f}   {pred.mean():.3f}      {pred.mean() - true:+.3f}   "
                      f"{np.sqrt(np.mean(out['j_se'][:, i, h, j] ** 2)):.3f}      "
                      f"{np.sqrt(np.mean((pred - true) ** 2)):.3f}      {out['j_in'][:, i, h, j].mean():.3f}      "
                      f"{out['j_width'][:, i, h, j].mean():.3f}")


def main() -> None:
    """Run the study on every population and print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pilots", type=int, default=100)
    ap.add_argument("--n0", type=int, default=32)
    ap.add_argument("--means", default=MEANS[0], choices=MEANS)
    ap.add_argument("--quick", action="store_true", help="20 pilots, two populations")
    ap.add_argument("--widths-only", action="store_true", help="the width predictions only (no J_N)")
    ap.add_argument("--held-out", action="store_true", help="the held-out populations only")
    ap.add_argument("--fresh", action="store_true", help="the populations built for issue 49's third round only")
    ap.add_argument("--only", default="", help="the populations whose name contains this text")
    a = ap.parse_args()
    ns, ks, level = [64, 128, 256, 512], [5, 10], 0.9
    chosen = fresh() if a.fresh else held_out() if a.held_out else populations()
    pops = {k: v for k, v in chosen.items() if a.only in k}
    if a.quick:
        a.pilots, pops = 20, dict(list(pops.items())[:2])
    print(f"n0 = {a.n0}, N = {ns}, k = {ks}, means = {a.means}, ranking absolute, prediction level {level}")
    for i, (name, P) in enumerate(pops.items()):
        t0 = time.process_time()
        out = study(P, n0=a.n0, ns=ns, ks=ks, pilots=a.pilots, ranking="absolute", seed=1000 + i, means=a.means,
                    level=level, widths_only=a.widths_only)
        report(name, out, ns, ks, a.pilots, level)
        print(f"  ({time.process_time() - t0:.0f} CPU-s)")


if __name__ == "__main__":
    main()
