"""Auditing a published circuit: a circuit someone else found (an EAP-IG / MIB graph JSON, or a plain edge list)
checked on the user's model and prompts by the audit's own stages.

The audit (circuitstat.pipelines.runs.audit.run) reads the file right after loading the model, before any run
directory exists: every name must be an edge of the model's graph and a JSON must describe the model's
shape (both InputError, exit 2). It adds the circuit's size, half and double to the k grid, so the
stability, inclusion and faithfulness tables have the curve around the circuit's size, and then writes
two tables in its ``published`` stage:

* ``published_circuit`` (one row per method): the circuit's faithfulness with the bootstrap interval of a
  *fixed* circuit -- the circuit was not selected from these prompts, so there is no selection to
  account for and the estimand is this fixed circuit's faithfulness over the task's prompt distribution
  (the selection-aware interval of the audit's own top-k circuits answers another question, and sits
  beside it in ``faithfulness_vs_k``); CPR/CMD of the file's scores ranked at MIB's percentages, when the
  file has scores, with a percentile interval over the same resamples; how many of its edges are
  not supported at the spec's q (BH q-values of ``edge_stats``); their inclusion frequency in the audit's
  top-k circuits of the same size; and its overlap with the audit's own top-k circuit.
* ``published_circuit_edges`` (one row per method and circuit edge): the edge's mean effect, interval,
  q-value, whether it is supported at q, and its inclusion frequency under resampling.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from circuitstat.core.errors import InputError

__all__ = ["read_circuit_file", "sizes_around", "published_tables", "MAX_CIRCUIT_BYTES"]

MAX_CIRCUIT_BYTES = 256 * 2**20  # GPT-2 small's full EAP-IG JSON is ~3 MB; Llama-3.1-8B's is far below this
CPR_ESTIMAND = ("the area under the faithfulness curve of the file's fixed score ranking, at MIB's percentages, "
                "over the task's prompt distribution")


def read_circuit_file(path: str | Path, fmt: str, graph, d_model: int | None = None):
    """The circuit in ``path`` (format ``eap-ig`` or ``edges``) checked against ``graph``; InputError naming the
    problem (missing file, unknown edges with their count, another model's shape, an empty or full circuit)."""
    from circuitstat.circuits.circuit import Circuit
    from circuitstat.circuits.circuit.graph_ops import unknown_message

    import os
    import stat

    from circuitstat.core.outpath import what_is

    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise InputError(f"circuit file {p} not found; check circuit.file (relative to the spec)") from None
    except OSError as e:
        raise InputError(f"circuit file {p} cannot be read ({e.strerror or e}); give a readable circuit file") from None
    if not stat.S_ISREG(mode):  # a directory, FIFO or device is never opened (a FIFO would block, /dev/zero never end)
        raise InputError(f"circuit file {p} is {what_is(mode)}, not a regular file; give the circuit's JSON or "
                         "edge-list file")
    if p.stat().st_size > MAX_CIRCUIT_BYTES:
        raise InputError(f"circuit file {p} is larger than {MAX_CIRCUIT_BYTES // 2**20} MiB; not a circuit file")
    if fmt == "eap-ig":
        circuit = Circuit.from_json(p, graph=graph)
    else:
        try:
            lines = p.read_text().splitlines()
        except UnicodeDecodeError:
            raise InputError(f"{p} is not text; an edge list has one sender->receiver per line") from None
        names = list(dict.fromkeys(s for s in (line.split("#")[0].strip() for line in lines) if s))
        bad = next((i for i, name in enumerate(names) if "->" not in name or len(name) > 200), None)
        if bad is not None:  # named by its position, never quoted: the file may be anything
            looks = " (the file looks like JSON: use format eap-ig, --format eap-ig)" if names[bad][:1] in "{[" else ""
            raise InputError(f"{p}: entry {bad + 1} is not an edge name sender->receiver such as "
                             f"{graph.edge_names[0]!r}{looks}")
        unknown = [n for n in names if n not in graph._edge_lookup]
        if unknown:
            raise InputError(f"{p}: " + unknown_message("edge", unknown, graph.edge_names, graph))
        circuit = Circuit.from_edges(graph, names, d_model=d_model)
    if circuit.n_edges == 0:
        raise InputError(f"{p} marks no edge as in the circuit; a published circuit needs at least one edge")
    if circuit.n_edges == graph.n_edges:
        raise InputError(f"{p} marks every edge as in the circuit (an importance-score file, not a circuit); "
                         "select a circuit from it first, e.g. `circuitstat circuit RUN --k K --json FILE`")
    return circuit


def sizes_around(ks: list[int], k_c: int, n_edges: int) -> list[int]:
    """The audit's k grid with the published circuit's size, its half and its double (each below n_edges)."""
    extra = {max(1, k_c // 2), k_c, min(2 * k_c, n_edges - 1)}
    return sorted(set(ks) | {k for k in extra if 1 <= k < n_edges})


def _rows(table, method: str, **eq) -> dict[str, np.ndarray]:
    """Columns of ``table`` (a pyarrow Table) restricted to ``method`` and the equalities in ``eq``."""
    d = table.to_pydict()
    keep = np.asarray(d["method"]) == method
    for col, v in eq.items():
        keep &= np.asarray(d[col]) == v
    return {c: np.asarray(v)[keep] for c, v in d.items()}


def _cpr_cmd(model, task, circuit, plan, spec, ablation) -> dict:
    """CPR/CMD of the file's scores at MIB's percentages with percentile intervals (NaN with a note without scores)."""
    from circuitstat.circuits.faithfulness import MIB_FRACTIONS, curve_areas, faithfulness_curve
    from circuitstat.stats.faithfulness import fixed_circuit_interval
    from circuitstat.stats.fieller import fieller_over_plan

    nan = {"cpr": np.nan, "cpr_ci_low": np.nan, "cpr_ci_high": np.nan, "cmd": np.nan, "cmd_ci_low": np.nan,
           "cmd_ci_high": np.nan}
    if circuit.scores is None or not np.isfinite(circuit.scores).all():
        return {**nan, "area_note": "the file has no score for every edge: CPR/CMD rank edges by score"}
    res = faithfulness_curve(model, task, circuit.scores, ranking=spec.ranking, fractions=MIB_FRACTIONS, prune=True,
                             ablation=ablation, seed=spec.seed, batch_size=spec.batch_size, progress=False)
    dist = fixed_circuit_interval(res.m_circuit, res.m_clean, res.m_empty, plan, method="percentile",
                                  confidence_level=spec.bootstrap.confidence_level,
                                  keep_distribution=True).bootstrap_distribution
    dist = np.asarray(dist, dtype=np.float64)  # [C, B]: one row per circuit size
    _, cmd_b = curve_areas(res.x, dist.T)
    a = (1 - spec.bootstrap.confidence_level) / 2
    lo, hi = (lambda v: float(np.nanquantile(v, a)), lambda v: float(np.nanquantile(v, 1 - a)))
    # CPR is linear in the curve, so it is a ratio of means over the shared denominator: Fieller's set. CMD sums
    # |1 - f|, which is not a ratio: its interval stays the bootstrap percentile one.
    m0 = np.asarray(res.m_empty, dtype=np.float64)
    cpr_num, _ = curve_areas(res.x, np.asarray(res.m_circuit, dtype=np.float64) - m0[:, None])
    cpr = fieller_over_plan(cpr_num, res.m_clean, m0, plan, confidence_level=spec.bootstrap.confidence_level)
    note = cpr.notes()[0]
    return {"cpr": res.cpr, "cpr_ci_low": float(cpr.low[0]), "cpr_ci_high": float(cpr.high[0]), "cmd": res.cmd,
            "cmd_ci_low": lo(cmd_b), "cmd_ci_high": hi(cmd_b),
            "area_note": f"the file's scores ranked {spec.ranking}, pruned, trapezoids over MIB's nominal percentages; "
                         f"CPR: Fieller's interval (a ratio of means); CMD: percentile interval over {plan.n_resamples} "
                         f"resamples (covers: {CPR_ESTIMAND})" + (f"; CPR: {note}" if note else "")}


def published_tables(model, task, circuit, scores: dict, run_tables: dict, plan, spec, *, source: str) -> dict:
    """{'published_circuit', 'published_circuit_edges'} columns for ``circuit`` (module doc). ``run_tables``: the
    audit's edge_stats, inclusion and (when measured) faithfulness_vs_k as pyarrow Tables; ``source``: the file's
    name as shown (never its directory)."""
    from circuitstat.circuits.circuit import Circuit
    from circuitstat.circuits.faithfulness import faithfulness
    from circuitstat.core.score_columns import column_means
    from circuitstat.pipelines.runs.audit.tables import ablation_of
    from circuitstat.stats.faithfulness import fixed_circuit_interval
    from circuitstat.stats.fieller import FIELLER_ESTIMAND, fieller_over_plan

    ablation = ablation_of(model, task, spec)
    res = faithfulness(model, task, circuit, ablation=ablation, seed=spec.seed, batch_size=spec.batch_size,
                       progress=False)
    fixed = fixed_circuit_interval(res.m_circuit, res.m_clean, res.m_empty, plan, method="percentile",
                                   confidence_level=spec.bootstrap.confidence_level)  # its standard error
    m0 = np.asarray(res.m_empty, dtype=np.float64)
    fie = fieller_over_plan(np.asarray(res.m_circuit, dtype=np.float64) - m0[:, None], res.m_clean, m0, plan,
                            confidence_level=spec.bootstrap.confidence_level)
    areas = _cpr_cmd(model, task, circuit, plan, spec, ablation)
    k_c, idx, q_level = circuit.n_edges, circuit.edge_indices, spec.circuit.q
    summary: dict[str, list] = {}
    edges: dict[str, list] = {}
    for m in scores:  # the methods with per-example scores (a mask-learned one has no q-values)
        es = _rows(run_tables["edge_stats"], m)
        order = np.argsort(es["edge"])
        est, lo, hi, q = (es[c][order][idx].astype(np.float64) for c in ("estimate", "ci_low", "ci_high", "q"))
        inc = _rows(run_tables["inclusion"], m, k=k_c)
        freq_of = dict(zip(inc["edge"].tolist(), inc["frequency"].tolist()))
        freq = np.array([freq_of.get(int(e), 0.0) for e in idx])  # no row: never in a resample's top-k
        supported = q <= q_level
        mean = column_means(scores[m])  # block by block when the run streams its scores: the same bits
        top = Circuit.top_k(mean.astype(np.float32), k_c, ranking=spec.ranking, seed=spec.seed, graph=model.graph)
        jac = float((top.edges & circuit.edges).sum() / (top.edges | circuit.edges).sum())
        fv = run_tables.get("faithfulness_vs_k")
        f_rows = _rows(fv, m, k=k_c) if fv is not None else {}
        row = {"method": m, "circuit": source, "format": spec.circuit.file_format, "n_edges": k_c,
               "n_nodes": circuit.n_nodes, "f_ratio": float(res.ratio_of_means[0]),
               "f_mean": float(res.mean_per_example[0]), "f_ci_low": float(fie.low[0]),
               "f_ci_high": float(fie.high[0]), "f_se": float(fixed.standard_error[0]),
               "f_ci_method": "fieller", "f_ci_estimand": FIELLER_ESTIMAND, "f_ci_note": fie.notes()[0],
               **areas, "q_level": q_level,
               "n_unsupported": int((~supported).sum()), "share_unsupported": float((~supported).mean()),
               "inclusion_mean": float(freq.mean()), "inclusion_min": float(freq.min()), "topk_jaccard": jac,
               "topk_f_ratio": float(f_rows["f_ratio"][0]) if len(f_rows.get("f_ratio", [])) else np.nan,
               "topk_f_selected": float(f_rows["f_selected"][0]) if len(f_rows.get("f_selected", [])) else np.nan,
               "n_undefined": int(res.n_undefined)}
        for c, v in row.items():
            summary.setdefault(c, []).append(v)
        cols = {"method": [m] * k_c, "edge": idx.astype(np.int64), "name": circuit.edge_names, "estimate": est,
                "ci_low": lo, "ci_high": hi, "q": q, "supported": supported, "inclusion": freq}
        for c, v in cols.items():
            edges.setdefault(c, []).extend(list(v))
    return {"published_circuit": summary, "published_circuit_edges": edges}
