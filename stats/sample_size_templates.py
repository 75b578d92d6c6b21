"""sample-size under the cluster scheme: a templated pilot's template means as units, and simulated datasets of whole
pilot templates (docs/sample-size.md, "A cluster-scheme pilot"); the model fitted to them is
circuitstat.stats.sample_size's."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from circuitstat.core.seeds import as_seed_sequence, spawn_seeds

from .pilot_model import fit_pilot

__all__ = ["template_means", "template_counts", "simulated_template_datasets"]


def template_means(S: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Return the per-template mean scores [G, E] of S [n0, E] (templates in label order): the cluster scheme's
    units."""
    _, inv = np.unique(np.asarray(groups), return_inverse=True)
    S = np.asarray(S, dtype=np.float64)
    sums = np.zeros((int(inv.max()) + 1, S.shape[1]))
    np.add.at(sums, inv, S)
    return sums / np.bincount(inv)[:, None]


def template_counts(ns: np.ndarray, n0: int, n_templates: int) -> np.ndarray:
    """Return the templates a dataset of each n holds at the pilot's prompts per template: max(2, round(n G0 / n0))."""
    return np.maximum(2, np.rint(np.asarray(ns, dtype=np.float64) * n_templates / n0)).astype(np.int64)


def simulated_template_datasets(S: np.ndarray, groups: np.ndarray, n_templates: int, n_datasets: int, *,
                                ranking: str, seed: Any = None, means: str = "tested"
                                ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield n_datasets (dataset [n, E], its templates [n]) of `n_templates` whole pilot templates each.

    As simulated_datasets, at the template level: the model is refitted to a resample of the pilot's templates
    drawn with replacement (each copy a template of its own), and a dataset draws n_templates of those copies
    with replacement, every prompt of a drawn template included, so prompts of one template stay correlated."""
    S = np.asarray(S, dtype=np.float64)
    _, inv = np.unique(np.asarray(groups), return_inverse=True)
    members = [np.flatnonzero(inv == g) for g in range(int(inv.max()) + 1)]
    c_plan, c_rows = spawn_seeds(as_seed_sequence(seed), 2)
    r_plan, rng = np.random.default_rng(c_plan), np.random.default_rng(c_rows)
    for _ in range(int(n_datasets)):
        copies = r_plan.integers(0, len(members), len(members))
        rows = [members[g] for g in copies]
        starts = np.cumsum([0] + [r.size for r in rows])
        fit = fit_pilot(S[np.concatenate(rows)], ranking=ranking, means=means)
        drawn = rng.integers(0, len(rows), int(n_templates))
        idx = np.concatenate([np.arange(starts[c], starts[c + 1]) for c in drawn])
        labels = np.repeat(np.arange(int(n_templates)), [rows[c].size for c in drawn])
        yield fit.dataset(idx, rng), labels
