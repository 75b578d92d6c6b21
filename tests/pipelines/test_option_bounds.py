"""Low-severity input bounds (issue 38, adversarial item 8): a repeated --task-option, a 100 KB value
quoted in an error line, a --max-memory above the machine's memory."""

from __future__ import annotations

from typer.testing import CliRunner

import pytest

from circuitstat.pipelines.cli import app

runner = CliRunner()
TINY = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64"


def test_a_repeated_task_option_is_refused_not_silently_overwritten(tmp_path) -> None:
    from circuitstat.pipelines.build import parse_task_options
    from circuitstat.core.errors import InputError

    with pytest.raises(InputError, match="seq_len is given more than once"):
        parse_task_options("induction", ["seq_len=5", "seq_len=6"])
    assert parse_task_options("induction", ["seq_len=5"]) == {"seq_len": 5}
    out = tmp_path / "run"
    r = runner.invoke(app, ["attribute", "--model", TINY, "--task-option", "seq_len=5", "--task-option", "seq_len=6",
                            "--n", "4", "--out", str(out)])
    assert r.exit_code == 2 and "more than once" in r.stderr and not out.exists(), r.output


def test_an_error_quoting_a_100_kb_value_shows_its_ends_and_length() -> None:
    from circuitstat.pipelines.cli.app import QUOTE_MAX, shorten_values

    template = "When [A] and [B] went " + "x " * 50_000
    r = runner.invoke(app, ["attribute", "--model", "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=50257&"
                            "n_positions=64", "--task", "ioi", "--task-option", f'templates=["{template}"]',
                            "--out", "/nonexistent/run"])
    err = r.stderr.strip()
    assert r.exit_code == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, err[:300]
    assert len(err) < 3 * QUOTE_MAX and f"({len(template):,} characters)" in err, err
    assert "When [A] and [B] went" in err  # the start of the value names it
    # short values, paths and messages pass unchanged
    for text in ("bad 'abc' in \"def\"", "/tmp/" + "d" * 200 + "/run: no such file", "x " * 1000,
                 # two short quoted words (or apostrophes) around a long list are not one long value
                 "claims[9]: every claim needs a 'kind'; kinds: " + ", ".join(["edge_in_circuit"] * 40)
                 + "; claims[12]: give a bound: 'min' and/or 'max'", "the run's " + "edge " * 120 + "the model's"):
        assert shorten_values(text) == text
    long = "'" + "v" * (2 * QUOTE_MAX) + "'"
    assert shorten_values(f"bad value {long}") == f"bad value '{'v' * (QUOTE_MAX // 2)}…{'v' * (QUOTE_MAX // 2)}' " \
                                                  f"({2 * QUOTE_MAX:,} characters)"


def test_query_max_memory_is_bounded_by_the_machine(tmp_path) -> None:
    from circuitstat.circuits.limits import check_budget, machine_memory
    from circuitstat.core.errors import InputError

    have = machine_memory()
    assert have is not None and have > 2**20
    assert check_budget(have) == have
    with pytest.raises(InputError, match="more than this machine's memory"):
        check_budget(have + 1)
    r = runner.invoke(app, ["query", "SELECT 1", str(tmp_path), "--max-memory", "100TiB"])
    assert r.exit_code == 2 and "--max-memory 100.0 TiB is more than this machine's memory" in r.stderr, r.output


def test_attribute_max_memory_is_bounded_when_running_but_not_when_planning(tmp_path) -> None:
    out = tmp_path / "run"
    r = runner.invoke(app, ["attribute", "--model", TINY, "--n", "4", "--max-memory", "100TiB", "--out", str(out)])
    assert r.exit_code == 2 and "more than this machine's memory" in r.stderr and not out.exists(), r.output
