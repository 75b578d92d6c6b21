"""Exact patching on a subset, for verifying an approximate run: some examples, some edges (or receivers).

A verified run (issue 33) computes an approximation (EAP, EAP-IG, AtP*) on all N examples and exact
patching on a subset: a random n of the examples and/or the edges of some receivers (``exact_subset``: a
rectangle, whole prompts x chosen edges), or chosen (example, edge) cells (``exact_cells``: the active design,
circuitstat.stats.verified.active, where each prompt has its own edges).  Exact patching
is priced per suffix row, one row per (example, edge) (circuitstat.circuits.attribution._exact_edges): an edge
u → v costs one suffix forward from v's layer, so only the selected edges' rows are recomputed.

The subset's numbers are the full exact run's, bit for bit, restricted to its rows and columns (with
the same ``batch_size``; tests/circuits/test_verify.py):

* examples run in the full run's batches (batch k holds examples kB..kB+B−1): a batch with a selected
  example computes its clean and counterfactual forwards on the whole batch, as the full run does, and
  suffix rows only for its selected examples;
* a suffix row's window is its own and no call has fewer than ``MIN_ROWS`` rows (circuitstat.circuits.attribution),
  so a row's result does not depend on which other rows share its call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.params import BATCH_SIZE

from .attribution import attribute
from .model import CircuitModel


@dataclass(frozen=True)
class SubsetExact:
    """Exact per-example effects on a subset: ``scores`` [len(rows), len(edges)] float32."""

    scores: np.ndarray
    rows: np.ndarray  # example indices, as given (sorted, unique)
    edges: np.ndarray  # edge indices (sorted, unique)
    receivers: np.ndarray  # receivers whose suffixes were run
    batch_examples: int  # examples whose clean and counterfactual forwards ran (whole batches)
    suffix_rows: int  # (example, edge) rows priced: len(rows) x len(edges)

    def column(self, name: str, graph) -> np.ndarray:
        """Per-example exact effects of one selected edge, by name."""
        e = graph.edge_names.index(name)
        hit = np.flatnonzero(self.edges == e)
        if not hit.size:
            raise InputError(f"edge {name!r} was not verified; verified edges: {len(self.edges)}")
        return self.scores[:, hit[0]]


def _indices(values, size: int, what: str) -> np.ndarray:
    """Sorted unique indices in [0, size) from ``values``; InputError naming ``what`` otherwise."""
    idx = np.asarray(values)
    if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer) or idx.min() < 0 or idx.max() >= size:
        raise InputError(f"{what} must be a non-empty list of indices in [0, {size})")
    return np.unique(idx.astype(np.int64))


def subset_edges(model: CircuitModel, edges=None, receivers=None) -> np.ndarray:
    """Sorted edge indices: ``edges`` plus every edge into ``receivers`` (all edges when both are None)."""
    g = model.graph
    if edges is None and receivers is None:
        return np.arange(g.n_edges)
    out = [] if edges is None else [_indices(edges, g.n_edges, "edges")]
    if receivers is not None:
        for r in _indices(receivers, g.n_receivers, "receivers"):
            off = int(g.edge_offset[r])
            out.append(np.arange(off, off + int(g.n_upstream[r])))
    return np.unique(np.concatenate(out))


def whole_batches(picked: np.ndarray, N: int, batch_size: int) -> np.ndarray:
    """Return the examples of the full run's batches (batch k: kB..kB+B-1) that hold one of ``picked``, in order:
    their clean and counterfactual forwards run on the whole batch, as in the full run (the bits depend on it)."""
    batches = np.unique(np.asarray(picked, np.int64) // batch_size)
    return np.concatenate([np.arange(b * batch_size, min(N, (b + 1) * batch_size)) for b in batches])


def _check_sizes(data, batch_size) -> int:
    """Return N, the examples of ``data``; InputError for an empty dataset or a bad batch size."""
    N = int(data.clean.shape[0])
    if N == 0:
        raise InputError("the dataset is empty; give at least one example")
    if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
    return N


def exact_subset(model: CircuitModel, data, *, rows=None, edges=None, receivers=None,
                 batch_size: int = BATCH_SIZE.default, max_rows: int = 256, progress: bool = False,
                 **options) -> SubsetExact:
    """Exact per-example edge effects on ``rows`` (example indices; None: all) and the selected edges
    (``edges`` indices and/or all edges into ``receivers``; None: all), equal bit for bit to the full
    exact run (same ``batch_size``) restricted to them.  ``options`` go to attribute (ablation, seed, ...)."""
    N = _check_sizes(data, batch_size)
    picked = np.arange(N) if rows is None else _indices(rows, N, "rows")
    cols = subset_edges(model, edges, receivers)
    todo = whole_batches(picked, N, batch_size)
    keep = np.zeros((len(todo), model.graph.n_edges), dtype=bool)
    selected = np.isin(todo, picked)
    keep[np.ix_(selected, cols)] = True
    sm = attribute(model, data, "exact", rows=todo, edges=keep, batch_size=batch_size, max_rows=max_rows,
                   progress=progress, **options)
    scores = sm.scores[np.ix_(selected, cols)]
    recv = np.unique(model.graph.edge_receiver[cols])
    return SubsetExact(scores=scores, rows=picked, edges=cols, receivers=recv, batch_examples=len(todo),
                       suffix_rows=len(picked) * len(cols))


@dataclass(frozen=True)
class CellsExact:
    """Exact per-example effects on chosen (example, edge) cells: ``scores`` [N, E] float32, NaN outside ``cells``."""

    scores: np.ndarray
    cells: np.ndarray  # [N, E] bool, as given
    batch_examples: int  # examples whose clean and counterfactual forwards ran (the whole batches holding a cell)
    suffix_rows: int  # (example, edge) rows priced: one per chosen cell (a cell whose Δz cannot reach the
    # read-out scores its exact 0.0 without a row, as in the full run)


def exact_cells(model: CircuitModel, data, cells, *, batch_size: int = BATCH_SIZE.default, max_rows: int = 256,
                progress: bool = False, **options) -> CellsExact:
    """Return the exact per-example edge effects on the chosen cells (``cells`` [N, E] bool: True = patch this
    example's edge), equal bit for bit to the full exact run (same ``batch_size``) on those cells, with suffix rows
    for the chosen cells only (attribute's per-row edge mask).  ``options`` go to attribute (ablation, seed, ...)."""
    N = _check_sizes(data, batch_size)
    E = model.graph.n_edges
    C = np.asarray(cells)
    if C.dtype != bool or C.shape != (N, E):
        raise InputError(f"cells must be a [{N} examples, {E} edges] bool mask (True: patch that cell exactly), "
                         f"got {C.dtype} {C.shape}")
    picked = np.flatnonzero(C.any(1))
    if not picked.size:
        raise InputError("cells chooses no (example, edge) cell; set at least one True")
    todo = whole_batches(picked, N, batch_size)
    sm = attribute(model, data, "exact", rows=todo, edges=C[todo], batch_size=batch_size, max_rows=max_rows,
                   progress=progress, **options)
    scores = np.full((N, E), np.nan, dtype=np.float32)
    scores[todo] = sm.scores  # attribute leaves the cells it did not compute NaN
    return CellsExact(scores=scores, cells=C.copy(), batch_examples=len(todo), suffix_rows=int(C.sum()))
