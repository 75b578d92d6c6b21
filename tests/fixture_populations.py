"""Loader for the real heavy-tailed score population kept as a test fixture."""

from __future__ import annotations

from pathlib import Path

import numpy as np

ZOO_FIXTURE = Path(__file__).parent / "fixtures" / "zoo-induction-exact.parquet"


def load_zoo_fixture(path: Path = ZOO_FIXTURE) -> tuple[np.ndarray, list[str]]:
    """Return (scores [1024, E] float64, edge names) of the zoo induction fixture.

    Exact per-example edge scores of the zoo's attention-only seed-0 model on 1024 induction
    prompts, one float32 column per edge (see fixtures/make_zoo_induction_exact.py).
    """
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    names = list(table.column_names)
    scores = np.column_stack([table[c].to_numpy() for c in names]).astype(np.float64)
    return scores, names


ZOO_EAP_FIXTURE = Path(__file__).parent / "fixtures" / "zoo-induction-eap.parquet"


def load_zoo_pair() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Return (exact [1024, E], EAP [1024, E], edge names): the same model, prompts and edge order.

    A real paired population for the variance study's estimator factor: row i of both matrices
    is prompt i (see fixtures/make_zoo_induction_eap.py, which checks the prompts agree).
    """
    exact, names = load_zoo_fixture()
    eap, eap_names = load_zoo_fixture(ZOO_EAP_FIXTURE)
    if eap_names != names:
        raise AssertionError("the EAP fixture's edges are not the exact fixture's")
    return exact, eap, names


PLANTED_VERIFIED_FIXTURE = Path(__file__).parent / "fixtures" / "groundtruth-verified-planted3.parquet"


def load_planted_pair(path: Path = PLANTED_VERIFIED_FIXTURE) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Return (exact [1024, E], EAP [1024, E], edge names) of planted:induction?background=3 (EAP badly biased).

    Columns ``exact:<edge>`` and ``eap:<edge>`` of one prompt per row (see
    fixtures/make_groundtruth_verified.py); only the 50 edges whose scores vary are kept.
    """
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    names = [c.split(":", 1)[1] for c in table.column_names if c.startswith("exact:")]
    exact = np.column_stack([table[f"exact:{n}"].to_numpy() for n in names]).astype(np.float64)
    eap = np.column_stack([table[f"eap:{n}"].to_numpy() for n in names]).astype(np.float64)
    return exact, eap, names
