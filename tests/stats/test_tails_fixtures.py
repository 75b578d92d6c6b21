"""The heavy-tailed population fixtures (tests/fixtures/make_tails_populations.py): their shape, their
recorded commands (which the real CLI still parses) and the tail facts recorded with them."""

import json
import shlex
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from circuitstat.stats.tails import edge_tails

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FILES = {"mlp3l": (262, 3), "mlp4l-rotary": (479, 4)}


def _parse(argv: list[str]) -> None:
    """Parse ``circuitstat ARGV`` with the real CLI (click.UsageError on an unknown option or bad value)."""
    import typer

    from circuitstat.pipelines.cli import app

    cmd = typer.main.get_command(app)
    name, args = argv[0], list(argv[1:])
    cmd.commands[name].make_context(name, args)


@pytest.mark.parametrize("name", sorted(FILES))
def test_tails_fixture_holds_what_its_generator_says(name):
    n_edges, layers = FILES[name]
    tab = pq.read_table(FIXTURES / f"tails-{name}-induction-exact.parquet")
    assert tab.num_rows == 2048 and tab.num_columns == n_edges
    assert all(str(t) == "float" for t in tab.schema.types)  # float32
    names = tab.column_names
    assert names[-1].endswith("->logits") and f"a{layers - 1}.h0<q>" in "".join(names)
    meta = {k.decode(): v.decode() for k, v in tab.schema.metadata.items()}
    train, attribute = shlex.split(meta["train"]), shlex.split(meta["attribute"])
    assert train[:2] == ["circuitstat", "train"] and train[train.index("--layers") + 1] == str(layers)
    assert attribute[attribute.index("--method") + 1] == "exact" and attribute[attribute.index("--n") + 1] == "2048"
    for argv in (train, attribute):
        _parse(argv[1:])
    x = np.column_stack([c.to_numpy() for c in tab.columns]).astype(np.float64)
    facts, t = json.loads(meta["heavy_tails"]), edge_tails(x)
    k = t.excess_kurtosis[np.isfinite(t.excess_kurtosis)]
    np.testing.assert_allclose(facts["kurtosis_quantiles_10_50_90_max"], np.quantile(k, [0.1, 0.5, 0.9, 1.0]),
                               atol=0.06)
    assert facts["edges"] == n_edges and np.median(k) > 5  # heavy-tailed: the point of these populations
