"""``circuitstat check-circuit``: audit a published circuit (EAP-IG / MIB JSON or an edge list) on a model and task.

It writes the audit spec the options describe (with ``circuit: {file, format, q}``) into the run, runs the
audit's own stages (circuitstat.pipelines.runs.audit.run) and prints the ``published_circuit`` row; with
``--claims`` it then checks a claims file against the run, as ``circuitstat check`` does.
"""

from __future__ import annotations

from pathlib import Path

import typer

from circuitstat.core.params import BATCH_SIZE, N_RESAMPLES, SEED

from .analyse import Method, Ranking
from .app import ALLOW_LARGE_HELP, ALLOW_PICKLE_HELP, TASK_HELP, TASK_OPTION_HELP, app, check_out, choices, echo

CircuitFormat = choices("CircuitFormat", "eap-ig", "edges")


@app.command("check-circuit")
def check_circuit_command(
    circuit: Path = typer.Argument(..., help="the published circuit: EAP-IG / MIB graph JSON (edges with in_graph "
                                             "true) or an edge list (one sender->receiver per line, # comments)"),
    model: str = typer.Option(..., "--model", help="model source (directory, cached hub id, zoo:..., random:...)"),
    task: str = typer.Option(..., "--task", help=TASK_HELP),
    out: Path = typer.Option(..., "--out", help="run directory (resumes if it exists)"),
    n: int = typer.Option(64, "--n", min=2, help="prompts"),
    task_option: list[str] = typer.Option([], "--task-option", help=TASK_OPTION_HELP),
    method: list[Method] = typer.Option([Method("eap")], "--method", help="attribution method(s) for the edge "
                                        "q-values and inclusion frequencies (repeatable)"),
    fmt: CircuitFormat | None = typer.Option(None, "--format", help="file format (default: eap-ig for .json, "
                                                                    "else edges)"),
    q: float = typer.Option(0.05, "--q", min=1e-6, max=0.999, help="an edge is supported when its BH q-value is at "
                                                                  "most this"),
    k: list[int] = typer.Option([], "--k", min=1, help="more circuit sizes for the audit's curve (repeatable; "
                                                       "default 1; the circuit's size, half and double are always in)"),
    n_resamples: int = typer.Option(N_RESAMPLES.default, "--n-resamples", **N_RESAMPLES.option,
                                    help="bootstrap resamples"),
    ranking: Ranking = typer.Option(Ranking("absolute"), "--ranking", help="ranking of the audit's top-k circuits "
                                                                          "and of the file's scores for CPR/CMD"),
    batch_size: int = typer.Option(BATCH_SIZE.default, "--batch-size", **BATCH_SIZE.option),
    seed: int = typer.Option(SEED.default, "--seed", **SEED.option),
    claims: Path | None = typer.Option(None, "--claims", help="claims file to check against the run afterwards "
                                                             "(kind published_circuit, and any other audit kind)"),
    force: bool = typer.Option(False, "--force", help="recompute stages whose spec changed"),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help=ALLOW_PICKLE_HELP),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
) -> None:
    """Audit a published circuit on your model and prompts: its faithfulness (fixed-circuit interval), CPR/CMD
    of its scores, which edges are not supported at q, how often resampling selects them; exit 1 when a
    --claims claim fails, 2 on bad input (unknown edges, a circuit for another model shape)."""
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.build import parse_task_options
    from circuitstat.pipelines.kinds import kind
    from circuitstat.pipelines.spec import parse_spec

    check_out(out, "audit", force=force)
    cf = None
    if claims is not None:
        from circuitstat.pipelines.claims import claim_sizes, load_claims

        cf = load_claims(claims)  # a malformed file is exit 2 before any work
        k = list(k) + claim_sizes(cf)  # the k grid holds every size the claims ask about
    doc = {"model": model, "task": {"name": task, "n": n, "seed": seed, "options": parse_task_options(task, task_option)},
           "methods": list(dict.fromkeys(m.value for m in method)), "k": sorted(set(k)) or [1],
           "bootstrap": {"n_resamples": n_resamples}, "ranking": ranking.value, "batch_size": batch_size, "seed": seed,
           "circuit": {"file": str(circuit.resolve()), "format": None if fmt is None else fmt.value, "q": q}}
    spec = parse_spec(doc, "<check-circuit options>")  # the user's own paths: nothing to confine
    if cf is not None:
        from circuitstat.pipelines.claims import preflight

        preflight(cf, spec, "the audit these options describe (--method, --k, ...)")  # exit 2 before any work
    try:
        kind("audit").run(spec, out, force=force, allow_pickle=allow_pickle, allow_large=allow_large)  # the audit's road
    except InputError as e:  # the spec holds the file's absolute path (a resumed run finds it from anywhere):
        raise type(e)(as_given(str(e), circuit)) from None  # errors name it as the user gave it
    print_published(out)
    if cf is not None:
        from circuitstat.pipelines.claims import check, format_results

        report = check(cf, out, echo=lambda m: echo(m, err=True))
        echo(format_results(report.results))  # its notes (on binding a claims file to a run) do not apply here
        raise typer.Exit(report.exit_code)


def as_given(message: str, circuit: Path) -> str:
    """``message`` with the circuit file's absolute path written as the CIRCUIT argument was given."""
    return (message.replace(str(circuit.resolve()), str(circuit))
            .replace("check circuit.file (relative to the spec)", "check the CIRCUIT argument"))


def print_published(run: Path) -> None:
    """Print the run's published_circuit rows: faithfulness, CPR/CMD, unsupported edges and inclusion."""
    from circuitstat.core.tables import read_table

    t = read_table(run / "published_circuit.parquet").to_pylist()
    first = t[0]
    from circuitstat.core.words import counted

    echo(f"published circuit {first['circuit']} ({first['format']}): {counted(first['n_edges'], 'edge')}, "
         f"{counted(first['n_nodes'], 'node')}")
    echo(f"  faithfulness {first['f_ratio']:.3f} [{first['f_ci_low']:.3f}, {first['f_ci_high']:.3f}] "
         f"({first['f_ci_method']}; covers: {first['f_ci_estimand']})")
    if first.get("f_ci_note"):
        echo(f"  faithfulness: {first['f_ci_note']}")
    if first["cpr"] == first["cpr"]:
        echo(f"  CPR {first['cpr']:.3f} [{first['cpr_ci_low']:.3f}, {first['cpr_ci_high']:.3f}], "
             f"CMD {first['cmd']:.3f} [{first['cmd_ci_low']:.3f}, {first['cmd_ci_high']:.3f}]")
    else:
        echo(f"  CPR/CMD: n/a ({first['area_note']})")
    for r in t:
        echo(f"  {r['method']}: {r['n_unsupported']} of {r['n_edges']} edges not supported at q <= {r['q_level']:g}; "
             f"inclusion in resampled top-{r['n_edges']} circuits mean {r['inclusion_mean']:.2f}, min "
             f"{r['inclusion_min']:.2f}; Jaccard with this run's top-{r['n_edges']} {r['topk_jaccard']:.2f}")
    echo(f"  per edge: {run / 'published_circuit_edges.parquet'}")
