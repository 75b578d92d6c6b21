"""``sample-size``: how many prompts a run needs, predicted from a pilot run (circuitstat.pipelines.sample_size)."""

from __future__ import annotations

from pathlib import Path

import typer

from circuitstat.core.params import N_JOBS, SEED

from .app import ALLOW_LARGE_HELP, app, check_out, choices, echo, trust_option, verified

Means = choices("Means", "deconvolved", "pilot", "posterior")


@app.command("sample-size")
def sample_size_command(
    pilot: Path = typer.Argument(..., help="the pilot run: the --out of `circuitstat attribute` or `circuitstat audit` "
                                           "(a few dozen prompts, any method)"),
    n: list[int] = typer.Option([64, 128, 256, 512], "--n", min=2, max=10_000_000,
                                help="prompts N to predict at (repeatable)"),
    k: list[int] = typer.Option([5, 10, 20], "--k", min=1, help="circuit sizes (repeatable)"),
    target_jaccard: float = typer.Option(0.5, "--target", min=0.0, max=1.0,
                                         help="Jaccard the data-level interval's lower end should clear"),
    claims: Path | None = typer.Option(None, "--claims", help="a claims file: the chance each claim passes at N "
                                       f"(kinds edge_effect, circuit_stability, edge_in_circuit are simulated)"),
    out: Path | None = typer.Option(None, "--out", help="directory to write sample_size_*.parquet and "
                                                         "sample_size.svg into"),
    method: str | None = typer.Option(None, "--method", help="which scores of an audit pilot (one of its methods)"),
    datasets: int = typer.Option(20, "--datasets", min=2, max=10_000,
                                 help="simulated datasets per N for the chances (their Monte Carlo error is printed)"),
    means: Means = typer.Option("deconvolved", "--means", help="model means of the simulated population: the pilot's "
                                "means deconvolved of their noise, as they are, or posterior draws from "
                                "an NPMLE g-model (docs/sample-size.md)"),
    resamples: int | None = typer.Option(None, "--resamples", min=10, max=100_000,
                                         help="bootstrap resamples of the full run's intervals, as its audit will "
                                              "use them (default: the pilot audit's, else the audit default 1000)"),
    level: float = typer.Option(0.9, "--level", min=0.5, max=0.999, help="level of the prediction intervals"),
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
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.sample_size import pilot_groups, read_pilot, sample_size

    if out is not None:
        _check_sample_out(out, force)
    if pilot.is_dir():
        verified(pilot, trust_unrecorded)
    sm, spec = read_pilot(pilot, method, trust_unrecorded=trust_unrecorded)
    if sm.level != "edge":
        raise InputError(f"the pilot {pilot} scored {sm.level}s; sample-size needs edge scores "
                         "(`circuitstat attribute --level edge`)")
    cf = None
    if claims is not None:
        from circuitstat.pipelines.claims.parsing import load_claims

        cf = load_claims(claims)
    if resamples is not None:
        from circuitstat.pipelines.spec import AuditSpec

        spec = spec or AuditSpec(model="pilot")
        spec = spec.model_copy(update={"bootstrap": spec.bootstrap.model_copy(update={"n_resamples": resamples})})
    cost = _cost(sm, sorted(set(n)), model) if plan else None
    res = sample_size(sm.scores, sm.names, sm.method, n, k, target_jaccard, claims=cf, spec=spec, n_datasets=datasets,
                      seed=seed, means=means.value, prediction_level=level, n_jobs=n_jobs, cost=cost,
                      groups=pilot_groups(sm), allow_large=allow_large)
    _print(res, target_jaccard)
    if out is not None:
        from circuitstat.core.atomic import atomic_write
        from circuitstat.reports.html.sample_size import sample_size_svg

        paths = _write(res, out)
        svg = out / "sample_size.svg"
        with atomic_write(svg) as f:
            f.write(sample_size_svg(res.stability, res.widths, target=target_jaccard, level=level).encode())
        echo(f"wrote {', '.join(p.name for p in paths.values())} and {svg.name} -> {out}")


def _check_sample_out(out: Path, force: bool) -> None:
    """InputError when --out is not new, empty or (with --force) an earlier sample-size output (core/outpath.py)."""
    from circuitstat.core.errors import InputError

    check_out(out, "sample-size", force=force)  # a link, a file or another command's run: refused, --force or not
    if not force and (out / "manifest.json").is_file():
        raise InputError(f"--out {out} holds an earlier sample-size output; give a new --out or pass --force to "
                         "replace it")


def _write(res, out: Path) -> dict:
    """Write ``res`` into ``out`` through RunDir; an earlier output's tables this result does not have go, records too."""
    from circuitstat.core.rundir import RunDir

    with RunDir(out, spec=res.run_spec(), kind=res.run_kind) as run:
        for stale in sorted(out.glob("sample_size_*.parquet")):
            if stale.stem not in res.tables():
                run.remove_table(stale.stem)
        return res.write(run)


def _cost(sm, ns: list[int], source: str | None) -> dict:
    """Rows of cost_rows for the pilot's model (or ``source``), priced at this machine's matmul rate."""
    import torch

    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.plan import flop_rate
    from circuitstat.pipelines.sample_size import cost_rows
    from circuitstat.pipelines.sources import LOCAL

    source = source or (sm.provenance.get("model") or {}).get("source")
    if not source:
        raise InputError("the pilot records no model source to price; pass --model")
    skeleton = LOCAL.skeleton(source, weights=False, allow_large=True)  # shapes on meta: no size to refuse
    positions = int((sm.provenance.get("task") or {}).get("n_positions") or 0)
    if positions < 1:
        raise InputError("the pilot records no prompt length (task n_positions) to price; rerun the pilot with "
                         "`circuitstat attribute`")
    rate, how = flop_rate("cpu", torch.float32)
    echo(f"cost priced at {rate:.3g} TFLOP/s ({how}); a lower bound: per-call overhead and memory-bound work are "
         "left out (`circuitstat attribute --plan` times the passes)")
    return cost_rows(skeleton.cfg, ns, positions, ["exact", "eap"], rate)


def _print(res, target: float) -> None:
    """Print the per-N table: widths (median over edges), J_N per k with its interval and chance, claims."""
    import numpy as np

    w, s = res.widths, res.stability
    level = res.params["prediction_level"]
    echo(f"pilot: {res.params['n_pilot']} prompts ({res.params['method']}); prediction intervals at {level:.0%}")
    echo(f"{'N':>7}  {'median width':>12}  {'[prediction interval]':>22}  {'upper bound (plan)':>18}")
    for n in np.unique(w["n"]):
        sel = w["n"] == n
        echo(f"{n:>7}  {np.median(w['width'][sel]):>12.4g}  [{np.median(w['width_pi_low'][sel]):.4g}, "
             f"{np.median(w['width_pi_high'][sel]):.4g}]  {np.median(w['width_upper'][sel]):>18.4g}")
    echo(f"{'N':>7}  {'k':>4}  {'J_N':>6}  {'[prediction interval]':>16}  P(lower end >= {target:g})")
    for i in range(len(s["n"])):
        p = s["p_clear"][i]
        chance = "n/a (N < 32)" if p != p else f"{p:.2f} +- {s['p_clear_se'][i]:.2f}"
        echo(f"{s['n'][i]:>7}  {s['k'][i]:>4}  {s['jaccard'][i]:>6.3f}  [{s['jaccard_pi_low'][i]:.3f}, "
             f"{s['jaccard_pi_high'][i]:.3f}]    {chance}")
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
