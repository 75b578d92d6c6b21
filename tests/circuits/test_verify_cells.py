"""Exact patching on chosen (example, edge) cells (circuitstat.circuits.verify.exact_cells): bit for bit the full run on
those cells, one suffix row per chosen cell (counted, never timed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitstat.circuits import load_model
from circuitstat.circuits.attribution import attribute
from circuitstat.circuits.tasks import make_task
from circuitstat.circuits.verify import exact_cells, exact_subset
from circuitstat.core.errors import InputError

GPT2 = "random:gpt2?n_layer=2&n_head=4&n_embd=32&vocab_size=97&n_positions=64&seed=1"


def _cells(N, E, share, seed):
    """A scattered cell mask: every prompt its own edges (what the active design draws)."""
    return np.random.default_rng(seed).random((N, E)) < share


@pytest.mark.parametrize("ablation", ["counterfactual", "mean"])
def test_cells_equal_full_run_bit_for_bit(ablation):
    model = load_model(GPT2)
    task = make_task("induction", vocab_size=97, n=11, seed=0, seq_len=5)
    full = attribute(model, task, "exact", batch_size=4, max_rows=40, ablation=ablation, progress=False).scores
    E = model.graph.n_edges
    C = _cells(11, E, 0.05, 2)
    C[[5, 6, 7]] = False  # batch 1 (examples 4-7) holds only example 4's cells; batch 2 (8-10) holds several
    C[4] = False
    C[4, [0, 3, E - 1]] = True
    got = exact_cells(model, task, C, batch_size=4, max_rows=40, ablation=ablation)
    assert np.array_equal(got.scores[C], full[C])
    assert np.isnan(got.scores[~C]).all()  # nothing outside the chosen cells is reported
    assert np.abs(got.scores[C]).max() > 0  # not vacuous
    assert got.batch_examples == 11 and got.suffix_rows == int(C.sum())
    # negative control: the equality discriminates: cells shifted by one example (each row's mask applied to its
    # neighbour) give other prompts' effects, and the comparison fails
    shifted = exact_cells(model, task, np.roll(C, 1, axis=0), batch_size=4, max_rows=40, ablation=ablation)
    assert not np.array_equal(np.roll(shifted.scores, -1, axis=0)[C], full[C])


def test_cells_run_one_suffix_row_per_cell(monkeypatch):
    """The suffix rows actually run are the chosen cells: counted through the metric calls (one per suffix row
    after each batch's clean read-out) and the (example, edge) pairs the suffix calls fill."""
    model = load_model(GPT2)
    task = make_task("induction", vocab_size=97, n=10, seed=0, seq_len=5)
    E = model.graph.n_edges
    C = _cells(10, E, 0.04, 3)
    C[4:8] = False  # batch 1 holds no cell: its forwards are skipped
    counted = {"rows": 0, "forwards": 0}
    score, run = type(task).score, type(model).run

    def counting_score(self, logits, *a, **k):
        if logits.shape[0] and torch.is_grad_enabled() is False and k.get("clean_logits") is not None:
            counted["rows"] += int(logits.shape[0])
        return score(self, logits, *a, **k)

    def counting_run(self, *a, **k):
        counted["forwards"] += 1
        return run(self, *a, **k)

    monkeypatch.setattr(type(task), "score", counting_score)
    monkeypatch.setattr(type(model), "run", counting_run)
    # zero ablation: every Δz is nonzero everywhere, so no chosen cell is skipped as unreachable
    got = exact_cells(model, task, C, batch_size=4, ablation="zero")
    assert got.batch_examples == 4 + 2  # batches 0 (examples 0-3) and 2 (8, 9)
    assert counted["rows"] - got.batch_examples == got.suffix_rows == int(C.sum())
    assert counted["forwards"] == 2  # one clean run per batch holding a cell
    # negative control: the rectangle over the same prompts and edges (exact_subset) runs far more rows
    counted["rows"] = 0
    rect = exact_subset(model, task, rows=np.flatnonzero(C.any(1)), edges=np.flatnonzero(C.any(0)), batch_size=4,
                        ablation="zero")
    assert counted["rows"] - rect.batch_examples == rect.suffix_rows > 3 * int(C.sum())


def test_cells_errors():
    model = load_model(GPT2)
    task = make_task("induction", vocab_size=97, n=3, seed=0, seq_len=5)
    E = model.graph.n_edges
    with pytest.raises(InputError, match="bool mask"):
        exact_cells(model, task, np.zeros((3, E - 1), bool))
    with pytest.raises(InputError, match="bool mask"):
        exact_cells(model, task, np.zeros((3, E), np.int64))
    with pytest.raises(InputError, match="no .* cell"):
        exact_cells(model, task, np.zeros((3, E), bool))


def test_cells_cost_counts_the_rows_it_runs(monkeypatch):
    """circuits.plan.exact_cells_cost against a count of what exact_cells ran (zero ablation: no cell is skipped as
    unreachable); on a rectangle of cells it prices what exact_subset_cost prices."""
    from circuitstat.circuits.plan import exact_cells_cost, exact_subset_cost

    model = load_model(GPT2)
    task = make_task("induction", vocab_size=97, n=10, seed=0, seq_len=5)
    P, E = task.clean.shape[1], model.graph.n_edges
    C = _cells(10, E, 0.05, 4)
    C[0:4] = False
    counted = {"rows": 0}
    score = type(task).score

    def counting_score(self, logits, *a, **k):
        if logits.shape[0] and torch.is_grad_enabled() is False and k.get("clean_logits") is not None:
            counted["rows"] += int(logits.shape[0])
        return score(self, logits, *a, **k)

    monkeypatch.setattr(type(task), "score", counting_score)
    got = exact_cells(model, task, C, batch_size=4, ablation="zero")
    cost = exact_cells_cost(model.cfg, C.sum(0), positions=P, batch_examples=got.batch_examples, batch_size=4)
    assert cost.suffix_rows == counted["rows"] - got.batch_examples == int(C.sum())
    assert cost.forwards == 2 * got.batch_examples == 2 * (4 + 2)
    rect = np.zeros(E, np.int64)
    rect[[0, 7, 30]] = 3
    sub = exact_subset_cost(model.cfg, [0, 7, 30], n=3, positions=P, batch_examples=6, batch_size=4)
    same = exact_cells_cost(model.cfg, rect, positions=P, batch_examples=6, batch_size=4)
    assert (same.flops, same.suffix_rows, same.forwards, same.layer_passes, same.memory_peak) == (
        sub.flops, sub.suffix_rows, sub.forwards, sub.layer_passes, sub.memory_peak)
    # negative control: a different count per edge prices differently
    assert exact_cells_cost(model.cfg, np.roll(rect, 40), positions=P, batch_examples=6, batch_size=4).flops != same.flops
