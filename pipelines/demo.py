"""The main job (`make demo`): default zoo → audit with exact and EAP → head stability → HTML report."""

from __future__ import annotations

from pathlib import Path

import typer

DEMO_RECIPE = "attn-only-2l"


def demo_spec(n_jobs: int = 2, quick: bool = False):
    """The demo's audit spec: the zoo's attention-only seeds on the induction task.

    ``examples/audit-zoo.yaml`` is the same spec as a file (a test keeps them equal), so
    ``circuitstat check examples/claims-zoo.yaml --run runs/demo`` checks the demo's run.
    """
    from pipelines.spec import parse_spec
    from pipelines.zoo import ZOO_SEEDS

    return parse_spec({
        "models": [f"zoo:{DEMO_RECIPE}/seed-{s}" for s in ZOO_SEEDS],
        "task": {"name": "induction", "n": 24 if quick else 64, "seed": 0, "options": {"seq_len": 10}},
        "methods": ["exact", "eap"],
        "batch_size": 16,
        "bootstrap": {"n_resamples": 200 if quick else 1000},
        "k": [5, 10, 20, 50],
        "ranking": "absolute",
        "heads": {"n_probe": 20 if quick else 100, "n_resamples": 50 if quick else 200},
        "seed": 0,
        "n_jobs": n_jobs,
    }, "<demo>")


def print_summary(run: Path, echo=typer.echo) -> None:
    """Top edges with CIs, mean Jaccard at a few k, and the most and least stable heads."""
    import pyarrow.parquet as pq

    stats = pq.read_table(run / "edge_stats.parquet").to_pandas()
    shown = "exact" if (stats.method == "exact").any() else str(stats.method.iloc[0])
    exact = stats[stats.method == shown]
    top = exact.reindex(exact.estimate.abs().sort_values(ascending=False).index).head(8)
    ci = exact.ci_method.iloc[0]  # every column below is guaranteed by reports/schema.py
    echo(f"\nTop edges by {shown} effect (mean effect over the prompt distribution, 95% {ci} CI, BH q that inverts "
         "it; '!' = a few prompts carry the estimate):")
    for _, r in top.iterrows():
        flag = " " if r.interval_reliable else "!"
        echo(f"  {r['name']:<24} {r.estimate:+.3f}  [{r.ci_low:+.3f}, {r.ci_high:+.3f}]{flag} q={r.q:.2g}")
    stab = pq.read_table(run / "stability_vs_k.parquet").to_pandas()
    echo("\nCircuit stability: expected Jaccard of the top-k circuits of two independent prompt sets of this size, "
         "95% data-level CI (chance in brackets):")
    for method, g in stab.groupby("method", sort=False):
        cells = "  ".join(f"k={int(r.k)}: {r.jaccard_data:.2f} [{r.jaccard_data_ci_low:.2f}, "
                          f"{r.jaccard_data_ci_high:.2f}] ({r.jaccard_chance:.2f})"
                          for _, r in g.iterrows())
        echo(f"  {method:<6} {cells}")
    heads_path = run / "heads.parquet"
    if heads_path.exists():
        heads = pq.read_table(heads_path).to_pandas().sort_values("stability")
        echo("\nHead stability across seeds (best same-layer match; excess over the shuffled null with its 95% CI):")
        for label, rows in (("least stable", heads.head(3)), ("most stable", heads.tail(3)[::-1])):
            for _, r in rows.iterrows():
                excess = f"excess {r['excess']:+.2f} [{r['excess_ci_low']:+.2f}, {r['excess_ci_high']:+.2f}]"
                echo(f"  {label:<12} a{int(r['layer'])}.h{int(r['head'])}  {r['stability']:.2f}  {excess}  "
                     f"(null {r['null_mean']:.2f})")


