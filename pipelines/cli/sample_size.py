"""``sample-size``: how many prompts a run needs, predicted from a pilot run: the command builds the kind's spec and
calls its ``run`` (circuitstat.pipelines.runs.sample_size.run), and prints what it predicted."""

from __future__ import annotations

from pathlib import Path

import typer

from circuitstat.core.params import N_JOBS, N_RESAMPLES, SEED
from circuitstat.pipelines.options import (SAMPLE_SIZE_DATASETS, SAMPLE_SIZE_DATASETS_RANGE, SAMPLE_SIZE_KS,
                                           SAMPLE_SIZE_LEVEL, SAMPLE_SIZE_LEVEL_RANGE, SAMPLE_SIZE_MEANS,
                                           SAMPLE_SIZE_N_RANGE, SAMPLE_SIZE_NS, SAMPLE_SIZE_TARGET)

from .app import ALLOW_LARGE_HELP, app, choices, echo, trust_option, verified

Means = choices("Means", *SAMPLE_SIZE_MEANS)


@app.command("sample-size")
def sample_size_command(
    pilot: Path = typer.Argument(..., help="the pilot run: the --out of `circuitstat attribute` or `circuitstat audit` "
                                           "(a few dozen prompts, any method)"),
    n: list[int] = typer.Option(list(SAMPLE_SIZE_NS), "--n", min=SAMPLE_SIZE_N_RANGE[0], max=SAMPLE_SIZE_N_RANGE[1],
                                help="prompts N to predict at (repeatable)"),
    k: list[int] = typer.Option(list(SAMPLE_SIZE_KS), "--k", min=1, help="circuit sizes (repeatable)"),
    target_jaccard: float = typer.Option(SAMPLE_SIZE_TARGET, "--target", min=0.0, max=1.0,
                                         help="Jaccard the data-level interval's lower end should clear"),
    claims: Path | None = typer.Option(None, "--claims", help="a claims file: the chance each claim passes at N "
                                       f"(kinds edge_effect, circuit_stability, edge_in_circuit are simulated)"),
    out: Path | None = typer.Option(None, "--out", help="directory to write sample_size_*.parquet and "
                                                         "sample_size.svg into"),
    method: str | None = typer.Option(None, "--method", help="which scores of an audit pilot (one of its methods)"),
    datasets: int = typer.Option(SAMPLE_SIZE_DATASETS, "--datasets", min=SAMPLE_SIZE_DATASETS_RANGE[0],
                                 max=SAMPLE_SIZE_DATASETS_RANGE[1],
                                 help="simulated datasets per N for the chances (their Monte Carlo error is printed)"),
    means: Means = typer.Option(SAMPLE_SIZE_MEANS[0], "--means", help="model means of the simulated population: tested "
                                "(deconvolved, or all tied when the pilot tells no edge's mean apart: chi-square and "
                                "max-|t| tests at 5%), the pilot's means deconvolved of their noise, as they are, or "
                                "posterior draws from an NPMLE g-model (docs/sample-size.md)"),
    resamples: int | None = typer.Option(None, "--resamples", **N_RESAMPLES.option,
                                         help="bootstrap resamples of the full run's intervals, as its audit will "
                                              "use them (default: the pilot audit's, else the audit default "
                                              f"{N_RESAMPLES.default_for('audit')})"),
    level: float = typer.Option(SAMPLE_SIZE_LEVEL, "--level", min=SAMPLE_SIZE_LEVEL_RANGE[0],
                                max=SAMPLE_SIZE_LEVEL_RANGE[1], help="level of the prediction intervals"),
    plan: bool = typer.Option(False, "--plan",
                              help="also price each N's exact and EAP attribution on the pilot's model"),
    model: str | None = typer.Option(None, "--model", help="with --plan: the model to price (default: the pilot's)"),
    seed: int = typer.Option(SEED.default, "--seed", **SEED.option),
    n_jobs: int = typer.Option(N_JOBS.default, "--n-jobs", **N_JOBS.option),
    force: bool = typer.Option(False, "--force", help="replace an earlier sample-size output in --out (never "
                                                      "another command's run)"),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
    trust_unrecorded: bool = trust_option(),
) -> None:
    """Predict, from a pilot run's per-example scores, each edge's interval width, the expected data-level
    Jaccard of the top-k circuit (and the chance its interval's lower end clears --target), and the chance a
    claims file passes, at each N; with --plan, what each N costs. Every prediction has a stated error, and
    docs/sample-size.md says how well they held on populations where the truth is known."""
    from circuitstat.pipelines.kinds import kind
    from circuitstat.pipelines.runs.sample_size.run import check_sample_out

    if out is not None:
        check_sample_out(out, force)  # before the pilot is read
    if pilot.is_dir():
        verified(pilot, trust_unrecorded)
    run_kind = kind("sample-size")
    spec = run_kind.parse({"pilot": str(pilot), "n": n, "k": k, "target": target_jaccard,
                           "claims": None if claims is None else str(claims), "method": method, "datasets": datasets,
                           "means": means.value, "resamples": resamples, "level": level, "plan": plan, "model": model,
                           "seed": seed}, "the command line")
    res = run_kind.run(spec, out, n_jobs=n_jobs, allow_large=allow_large, trust_unrecorded=trust_unrecorded,
                       force=force, say=echo)
    _print(res, target_jaccard)
    if out is not None:
        echo(f"wrote {', '.join(f'{name}.parquet' for name in res.tables())} and sample_size.svg -> {out}")


def _print(res, target: float) -> None:
    """Print the per-N table: widths (median over edges; the upper bound with how many edges' bounds are below the
    pilot's own width, and the fix when some are not), J_N/2 (primary) and J_N per k with intervals, chance, claims."""
    import numpy as np

    from circuitstat.reports.sample_size_bound import bound_notes, bound_rows

    w, s = res.widths, res.stability
    level, n0 = res.params["prediction_level"], res.params["n_pilot"]
    rows = bound_rows(w)
    echo(f"pilot: {n0} prompts ({res.params['method']}); its own interval width {rows[0]['median_pilot_width']:.4g} "
         f"(median over edges); prediction intervals at {level:.0%}")
    echo(f"{'N':>7}  {'median width':>12}  {'[prediction interval]':>22}  {'upper bound (plan)':>18}  "
         "bound below the pilot's width")
    for n, row in zip(np.unique(w["n"]), rows):
        sel = w["n"] == n
        echo(f"{n:>7}  {np.median(w['width'][sel]):>12.4g}  [{np.median(w['width_pi_low'][sel]):.4g}, "
             f"{np.median(w['width_pi_high'][sel]):.4g}]  {row['median_upper']:>18.4g}  "
             f"{row['edges'] - row['uninformative']} of {row['edges']} edges")
    for line in bound_notes(rows, n0):
        echo(line)
    echo("stability: J_N/2 (primary) is what the audit of N prompts reports as jaccard_half (two disjoint halves of "
         "N/2); J_N (extrapolated) is two independent sets of N, as its jaccard_data")
    echo(f"{'N':>7}  {'k':>4}  {'J_N/2':>6}  {'[prediction interval]':>16}  {'J_N':>6}  {'[prediction interval]':>16}  "
         f"P(lower end >= {target:g}): J_N/2, J_N")
    for i in range(len(s["n"])):
        p, ph = s["p_clear"][i], s["p_clear_half"][i]
        chance = ("n/a (N < 32)" if p != p else
                  f"{ph:.2f} +- {s['p_clear_half_se'][i]:.2f}, {p:.2f} +- {s['p_clear_se'][i]:.2f}")
        echo(f"{s['n'][i]:>7}  {s['k'][i]:>4}  {s['jaccard_half'][i]:>6.3f}  [{s['jaccard_half_pi_low'][i]:.3f}, "
             f"{s['jaccard_half_pi_high'][i]:.3f}]    {s['jaccard'][i]:>6.3f}  [{s['jaccard_pi_low'][i]:.3f}, "
             f"{s['jaccard_pi_high'][i]:.3f}]    {chance}")
    from circuitstat.reports.sample_size_means import tied_note

    if note := tied_note(s):
        echo(note)
    if res.claims is not None:
        c = res.claims
        echo("claims: chance of passing")
        for i in range(len(c["n"])):
            p = c["p_pass"][i]
            echo(f"  N={c['n'][i]:<6} {c['label'][i]}: " + (f"{p:.2f} +- {c['p_pass_se'][i]:.2f}" if p == p
                                                              else f"n/a ({c['note'][i]})"))
    if res.cost is not None:
        c = res.cost
        echo("cost (FLOPs at the machine's matmul rate):")
        for i in range(len(c["n"])):
            echo(f"  N={c['n'][i]:<6} {c['method'][i]:<6} {c['flops'][i]:.3g} FLOPs  "
                 f"~{c['seconds_at_rate'][i]:.3g} s")
