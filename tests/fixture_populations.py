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


def verified_populations(only: list[str] | None = None) -> dict[str, tuple[np.ndarray, np.ndarray, list[str], bool]]:
    """Return {name: (exact, approximation, edge names, held out?)} of every paired population the verified-run
    studies measure (docs/verified.md): the zoo induction pair, planted background 3 and synthetic seed 7 chose the
    rules; planted background 5, synthetic seed 11 (fail share 0.6) and the three next-token pairs are held out.
    ``only``: keep just those names (an unknown name is an error, not an empty study)."""
    from circuitstat.stats.verified.coverage import paired_population

    fx = Path(__file__).parent / "fixtures"
    S, T = paired_population(2000, 60, seed=7)
    U, V = paired_population(2000, 60, seed=11, fail_share=0.6)
    edges = [f"e{i}" for i in range(60)]
    pops = {"zoo induction": (*load_zoo_pair(), False), "planted bg 3": (*load_planted_pair(), False),
            "synthetic (seed 7)": (S, T, edges, False),
            "planted bg 5": (*load_planted_pair(fx / "groundtruth-verified-planted5.parquet"), True),
            "synthetic (seed 11)": (U, V, edges, True)}
    for m in ("mlp3l", "mlp4l", "mlp3ls"):  # tests/fixtures/make_verified_nexttoken.py
        pops[f"{m} next-token"] = (*load_planted_pair(fx / f"verified-{m}-nexttoken.parquet"), True)
    if only:
        unknown = sorted(set(only) - set(pops))
        if unknown:
            raise SystemExit(f"unknown population(s) {unknown}; choose from {sorted(pops)}")
        pops = {k: v for k, v in pops.items() if k in only}
    return pops
