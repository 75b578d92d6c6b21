"""A run's scores as a submission to MIB's circuit-localization leaderboard (hannamw/MIB-circuit-track).

MIB's README ("Submitting to the MIB Leaderboard") asks for one folder per task and model, named
``<task>_<model>`` (the task's underscores written as hyphens, e.g. ``ioi_gpt2``, ``arc-easy_llama3``),
holding either

* ``importances``: a single ``.json`` with a floating-point score for every edge of the model (what MIB's
  own ``run_attribution.py`` writes as ``importances.json``; MIB's evaluation ranks them itself at its
  percentages), or
* ``circuits``: nine ``.json`` files with binary membership, one circuit of at most each of 0.1, 0.2, 0.5, 1,
  2, 5, 10, 20 and 50 % of the edges (the README's list; its 100 % point is the full model).

Each ``.json`` is EAP-IG's graph format (``eap/graph.py``: ``Graph.to_json`` / ``from_json``), which
:meth:`circuitstat.circuits.circuit.Circuit.to_json` writes; the submission keeps only the ``cfg``,
``nodes`` and ``edges`` keys EAP-IG's loader reads. The circuits are the top-k edges by the run's mean
scores at ``int(fraction * n_edges)`` (:func:`mib_circuits`), pruned as ``prune`` says, so each holds at most its
share:

* ``complete`` (default): to a fixpoint, every edge on an input -> logits path. This is the circuit MIB's evaluation
  scores: ``evaluate_area_under_curve`` takes ``apply_topn(n, prune=True)`` and EAP-IG's ``evaluate_graph`` calls
  ``graph.prune()`` again before patching, which completes it;
* ``mib``: one pass, dangling edges kept: what ``apply_topn(n, prune=True)`` itself leaves (EAP-IG at the commit
  MIB pins, 7af394a: its ``prune`` loop stops after the first pass) and what MIB counts as the circuit's size
  (``weighted_edge_counts``).

Both are checked edge for edge against EAP-IG's own ``Graph`` on all nine sizes
(tests/fixtures/mib-prune-eapig-7af394a.json, built by tests/fixtures/make_mib_prune.py).

What MIB has no place for travels beside it, in files MIB's loader does not read (it reads ``.json`` and
``.pt`` only): ``circuitstat-edges.parquet`` (each edge's mean effect, its interval, p and BH q-value,
with the estimand) and, when the run measured faithfulness, ``circuitstat-faithfulness.parquet`` (the
run's faithfulness curve with its fixed-circuit and selection-aware intervals and CPR/CMD).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from circuitstat.circuits.circuit.graph_ops import PRUNES
from circuitstat.core.errors import InputError

__all__ = ["MIB_CIRCUIT_FRACTIONS", "MIB_MODELS", "MIB_PRUNES", "MIB_TASKS", "MibExport", "export_mib", "mib_circuits",
           "mib_folder", "mib_model_name"]

#: The circuit sizes of a multiple-circuits submission: MIB's evaluation grid without its 100 % point.
MIB_CIRCUIT_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
#: MIB's model short names (MIB_circuit_track/utils.py MODEL_NAME_TO_FULLNAME, and interpbench), by the
#: Hugging Face ids circuitstat may have loaded them from.
MIB_MODELS = {"gpt2": "gpt2", "openai-community/gpt2": "gpt2", "gpt2-small": "gpt2",
              "Qwen/Qwen2.5-0.5B": "qwen2.5", "google/gemma-2-2b": "gemma2", "meta-llama/Llama-3.1-8B": "llama3"}
#: MIB's task folder names (utils.py COL_MAPPING): the leaderboard scores these only.
MIB_TASKS = ("ioi", "mcqa", "arithmetic-addition", "arithmetic-subtraction", "arc-easy", "arc-challenge")
#: How the nine circuits are pruned (module doc): to a fixpoint, or MIB's one pass (Circuit.prune's modes).
MIB_PRUNES = PRUNES
IMPORTANCES = "importances.json"
SIDECARS = ("circuitstat-edges.parquet", "circuitstat-faithfulness.parquet")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,63}")
_OURS = re.compile(r"importances\.json|edges_[0-9.]+pct\.json")


def circuit_file(fraction: float) -> str:
    """The file name of the circuit of at most ``fraction`` of the edges (e.g. ``edges_0.1pct.json``)."""
    return f"edges_{100 * fraction:g}pct.json"


def mib_model_name(source: str) -> str | None:
    """MIB's short name of a model source as a run records it (``hf:org/name[@revision]``, a hub id), or None."""
    return MIB_MODELS.get(source.removeprefix("hf:").split("@")[0])


def mib_circuits(scores, graph=None, *, ranking: str, seed: int = 0, prune: str = "complete") -> dict:
    """{file name: Circuit} of the nine sizes: the top ``int(fraction * n_edges)`` edges of ``scores`` (a ScoreMatrix,
    or a vector over ``graph``'s edges) by ``ranking``, ties at random from ``seed``, pruned as ``prune`` (module doc)."""
    from circuitstat.circuits.circuit import Circuit

    if prune not in MIB_PRUNES:
        raise InputError(f"prune must be one of {', '.join(MIB_PRUNES)}, got {prune!r}")
    n_edges = (graph if graph is not None else scores.graph).n_edges
    return {circuit_file(f): Circuit.top_k(scores, int(f * n_edges), ranking=ranking, seed=seed, graph=graph)
            .prune(prune) for f in MIB_CIRCUIT_FRACTIONS}


def mib_folder(task: str, model: str) -> str:
    """MIB's folder name ``<task>_<model>`` (underscores in the task as hyphens); InputError on unsafe names."""
    task = task.replace("_", "-")
    for what, name, flag in (("task", task, "--task-name"), ("model", model, "--model-name")):
        if not _NAME.fullmatch(name) or ".." in name:
            raise InputError(f"the {what} name is not usable in MIB's folder name <task>_<model> (letters, digits, "
                             f"'.' and '-' only, at most 64); pass {flag}")
    return f"{task}_{model}"


@dataclass
class MibExport:
    """What :func:`export_mib` wrote: the folder, its files, the method and ranking, and notes for the user."""

    folder: Path
    files: list[Path]
    method: str
    form: str
    notes: list[str] = field(default_factory=list)


def _names(run: Path, task_name: str | None, model_name: str | None) -> tuple[str, str, list[str]]:
    """(task, model, notes): MIB's names for the run's task and model, from the options or the manifest."""
    from circuitstat.core.rundir import RunDir, RunDirError

    try:
        manifest = RunDir.read_manifest(run)
    except RunDirError:
        manifest = {}
    spec = manifest.get("spec") if isinstance(manifest.get("spec"), dict) else {}
    notes = []
    if model_name is None:
        model_name = mib_model_name(str(spec.get("model") or ""))
        if model_name is None:
            raise InputError(f"{run}: the run's model is not one of MIB's ({', '.join(sorted(set(MIB_MODELS.values())))}"
                             "); pass --model-name with the name MIB's folder should carry")
    if task_name is None:
        task = spec.get("task")
        task_name = str(task.get("name", "")) if isinstance(task, dict) else ""
        if not task_name or "/" in task_name or "." in task_name:
            raise InputError(f"{run}: the run's task has no MIB name (a task file); pass --task-name")
    if task_name.replace("_", "-") not in MIB_TASKS:
        notes.append(f"task {task_name!r} is not one of MIB's ({', '.join(MIB_TASKS)}): its leaderboard will not "
                     "score this folder")
    return task_name, model_name, notes


def _check_out(out: Path, folder: Path, writing: list[str]) -> None:
    """InputError unless --out is a directory or a new name in one, and nothing below it that the export writes
    through or replaces is a link or a special file (the one output-path policy, circuitstat.core.outpath)."""
    from circuitstat.core.outpath import check_no_links

    if not out.is_dir() and (os.path.lexists(out) or not out.parent.is_dir()):
        raise InputError(f"--out {out} is not a directory, nor a new name in an existing one; give a directory")
    for name in writing:
        check_no_links(out, folder / name, flag="--out")


def _check_folder(folder: Path, writing: list[str], force: bool) -> None:
    """InputError when ``folder`` already holds an export (without ``force``) or circuit files MIB would also read."""
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{folder} is a file; give another --out")
    if not folder.is_dir():
        return
    present = sorted(p.name for p in folder.iterdir())
    ours = [n for n in present if _OURS.fullmatch(n) or n in SIDECARS]
    if ours and not force:
        raise InputError(f"{folder} already holds an export ({len(ours)} file(s), e.g. {ours[0]}); give a new --out "
                         "or pass --force to replace it")
    foreign = [n for n in present if n.endswith((".json", ".pt")) and not _OURS.fullmatch(n)]
    if foreign:
        raise InputError(f"{folder} holds {len(foreign)} other .json/.pt file(s) (e.g. {foreign[0]}) that MIB would "
                         "read as circuits too; remove them or give a new --out")
    for n in ours:  # --force: the previous export goes, so no stale circuit of another form stays beside this one
        if n not in writing:
            (folder / n).unlink()


def _mib_doc(circuit) -> bytes:
    """The circuit in EAP-IG's graph JSON, only the keys EAP-IG's Graph.from_json reads (cfg, nodes, edges)."""
    doc = circuit.to_json()
    return json.dumps({k: doc[k] for k in ("cfg", "nodes", "edges")}).encode()


def _sidecar(run: Path, table: str, method: str, provenance: dict):
    """The rows of ``method`` in the run's ``table`` (a pyarrow Table with provenance), or None without it."""
    import pyarrow.compute as pc

    from circuitstat.core.tables import read_table, with_provenance

    path = run / f"{table}.parquet"
    if not path.is_file():
        return None
    t = read_table(path)
    if "method" in t.column_names:
        t = t.filter(pc.equal(t.column("method"), method))
    return with_provenance(t.replace_schema_metadata(None), provenance)


def export_mib(run: str | Path, out: str | Path, *, method: str | None = None, form: str = "importances",
               task_name: str | None = None, model_name: str | None = None, ranking: str | None = None,
               seed: int = 0, force: bool = False, prune: str = "complete",
               trust_unrecorded: bool = False) -> MibExport:
    """Write the run's mean edge scores of ``method`` as MIB's ``<task>_<model>`` folder under ``out`` (module
    doc), with the run's intervals beside them; returns what was written. Checks everything before writing."""
    from circuitstat.circuits.circuit import Circuit
    from circuitstat.circuits.scores import ScoreMatrix
    from circuitstat.core.atomic import atomic_write_bytes
    from circuitstat.core.run_check import verify_outputs
    from circuitstat.core.tables import write_table
    from circuitstat.pipelines.circuit_choice import choose_scores, default_ranking

    run, out = Path(run), Path(out)
    if form not in ("importances", "circuits"):
        raise InputError(f"form must be 'importances' or 'circuits', got {form!r}")
    if prune not in MIB_PRUNES:
        raise InputError(f"prune must be one of {', '.join(MIB_PRUNES)}, got {prune!r}")
    if not run.is_dir():
        raise InputError(f"{run} is not a run directory; give the --out of an audit or attribute run")
    # export what the run wrote (sha256 in its manifest), as check and report read it
    verify_outputs(run, trust_unrecorded=trust_unrecorded)
    task, model, notes = _names(run, task_name, model_name)
    folder = out / mib_folder(task, model)
    choice = choose_scores(run, method)
    sm = ScoreMatrix.read(run, choice.table)
    if sm.level != "edge":
        raise InputError(f"{run} holds node-level scores; MIB's edge-level submission needs an edge-level run "
                         "(level: edge)")
    if not sm.graph.has_mlp:
        raise InputError("MIB's loader (EAP-IG's Graph.from_model) gives every layer an MLP node; an attention-only "
                         "model's graph cannot be submitted")
    mean = sm.mean()
    if not np.isfinite(mean).all():
        raise InputError(f"{run}: {int((~np.isfinite(mean)).sum())} edge scores are not finite; JSON cannot carry "
                         "them: fix the run")
    chosen = ranking or default_ranking(run)[0]
    if form == "importances":
        everything = np.ones(sm.graph.n_edges, dtype=bool)  # MIB ranks the scores itself; membership is unused
        docs = {IMPORTANCES: Circuit(sm.graph, everything, scores=mean, rule="importances", d_model=_d_model(sm))}
    else:
        docs = mib_circuits(sm, ranking=chosen, seed=seed, prune=prune)
    prov = {"run": str(run.name), "method": choice.method, "form": form, "ranking": chosen,
            **({"prune": prune} if form == "circuits" else {}),
            "mib_folder": folder.name, "scores": sm.describe()}
    sides = {name: _sidecar(run, table, choice.method, prov)
             for name, table in zip(SIDECARS, ("edge_stats", "faithfulness_vs_k"))}
    if sides[SIDECARS[0]] is None:
        notes.append("the run has no edge_stats (an attribute run): no intervals travel with it; "
                     "export an audit run for them")
    writing = [*docs, *(n for n, t in sides.items() if t is not None)]
    _check_out(out, folder, writing)
    _check_folder(folder, writing, force)
    folder.mkdir(parents=True, exist_ok=True)
    files = [atomic_write_bytes(folder / name, _mib_doc(c)) for name, c in docs.items()]
    files += [write_table(t, folder / name) for name, t in sides.items() if t is not None]
    return MibExport(folder, files, choice.method, form, notes)


def _d_model(sm) -> int | None:
    """d_model of the scores' model (EAP-IG's cfg needs it), from their provenance."""
    model = sm.provenance.get("model") if isinstance(sm.provenance, dict) else None
    d = model.get("d_model") if isinstance(model, dict) else None
    return d if isinstance(d, int) else None
