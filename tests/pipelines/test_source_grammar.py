"""One grammar for model sources (issue 46, item 3): the same strings get the same verdict at every entry point.

circuitstat.circuits.model_source.parse_source is the oracle: a string it refuses must be refused with its message
by the CLI (``attribute --plan``), an audit spec (loaded, then resolved as the audit resolves it), a service
submission and the service's pricing; a string it accepts must pass the grammar at each of them (a later refusal:
a missing directory, an uncached hub id, the operator's allow-list, is another matter and never the grammar's
message). The random sources are fully valid, so every entry point accepts them outright.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from circuitstat.circuits.model_source import Dir, Hub, Random, Served, Zoo, parse_source
from circuitstat.core.errors import InputError
from circuitstat.pipelines.cli import app
from circuitstat.pipelines.service.config import SourcesConfig
from circuitstat.pipelines.service.pricing import source_shape
from circuitstat.pipelines.service.problems import Problem
from circuitstat.pipelines.service.submission import prepare
from circuitstat.pipelines.sources import LOCAL
from circuitstat.pipelines.spec import load_spec
from circuitstat.pipelines.zoo import ZOO_RECIPES

GPT2 = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=128"
LLAMA = ("random:llama?hidden_size=32&num_hidden_layers=1&num_attention_heads=2&num_key_value_heads=1"
         "&intermediate_size=64&vocab_size=64&max_position_embeddings=128")
RUNNABLE = [GPT2, f"{GPT2}&seed=3", LLAMA, LLAMA + '&rope_scaling={"rope_type":"linear","factor":2}',
            f"{LLAMA}&rope_parameters.rope_type=linear&rope_parameters.factor=2"]
GRAMMATICAL = ["zoo:attn-only-2l/seed-0", "zoo:nope/seed-1", "served:gpt2-small", "openai-community/gpt2",
               "org/name@main", "hf:org/name", "./model", "/abs/path/model", "../outside", "~/models/x",
               "modèle-ü", "memory:GPT2LMHeadModel:gpt2"]
REFUSED = ["zoo:attn-only-2l/seed-07", "zoo:x/seed-07", "zoo:attn-only-2l/seed-0/..", "zoo:attn-only-2l/../x",
           "zoo:Attn/seed-0", "zoo:attn-only-2l", "served:", "served:../x", "hf:org", "hf:org/../x", "", " ",
           " random:gpt2", f"{GPT2} ", "a\tb", "http://example.com/model", "s3:bucket/model", "random:nope",
           "random:gpt2?n_layer", "random:gpt2?n_layer=1&n_layer=2", "random:gpt2?seed=x", "x" * 5000,
           "random:gpt2?foo.bar=1"]
SOURCES = RUNNABLE + GRAMMATICAL + REFUSED
runner = CliRunner()


def test_the_strings_are_forty_and_the_oracle_sorts_them_as_listed():
    """The oracle's own verdicts, so a grammar that accepted everything (or nothing) fails here first."""
    assert len(SOURCES) == len(set(SOURCES)) == 40
    for s in RUNNABLE:
        assert isinstance(parse_source(s), Random), s
    kinds = [type(parse_source(s, base="/nonexistent")) for s in GRAMMATICAL]
    assert {Zoo, Served, Hub, Dir} <= set(kinds)
    for s in REFUSED:
        with pytest.raises(InputError):
            parse_source(s)


def _grammar_error(source: str) -> str | None:
    """The grammar's message for ``source``, None when it parses."""
    try:
        parse_source(source)
    except InputError as e:
        return str(e)
    return None


def _cli(source: str, tmp_path) -> str | None:
    res = runner.invoke(app, ["attribute", "--model", source, "--task", "induction", "--n", "4", "--plan"])
    assert res.exit_code in (0, 2), (source, res.exit_code, res.output + res.stderr)  # never a traceback
    return None if res.exit_code == 0 else " ".join(res.stderr.split())


def _spec(source: str, tmp_path) -> str | None:
    path = tmp_path / "specs" / "spec.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump({"model": source, "task": {"name": "induction", "n": 4}, "methods": ["eap"],
                                    "k": [2]}))
    try:
        spec = load_spec(path)
        LOCAL.resolve(spec.model)  # what an audit does with its model before anything is built
    except InputError as e:
        return str(e)
    return None


def _service(source: str, tmp_path) -> str | None:
    spec = {"model": source, "task": {"name": "induction", "n": 4}, "methods": ["eap"], "k": [2]}
    sources = SourcesConfig(zoo=list(ZOO_RECIPES), random=True, models={"gpt2-small": str(tmp_path)})
    job = tmp_path / f"job{len(list(tmp_path.glob('job*')))}"
    try:
        prepare("audit", yaml.safe_dump(spec).encode(), None, [], job, sources)
    except Problem as e:
        assert e.status == 422, (source, e.status, e.detail)
        return e.detail
    return None


def _pricing(source: str, tmp_path) -> str | None:
    try:
        source_shape(source, {"gpt2-small": str(tmp_path)})
    except InputError as e:
        return str(e)
    return None


ENTRY_POINTS = {"cli": _cli, "spec": _spec, "service": _service, "pricing": _pricing}


def _mismatches(entry: str, tmp_path, sources=SOURCES) -> list[str]:
    """The strings on which entry point ``entry`` disagrees with the grammar (refused without its message, or
    refused by it at the entry point where the grammar accepts; a runnable source refused at all)."""
    bad = []
    for source in sources:
        expected = _grammar_error(source)
        got = ENTRY_POINTS[entry](source, tmp_path)
        if expected is not None:
            if got is None or " ".join(expected.split()) not in " ".join(got.split()):
                bad.append(source)
        elif (got is not None and "not a model source" in got) or (source in RUNNABLE and got is not None):
            bad.append(source)
    return bad


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_every_entry_point_gives_the_grammars_verdict_on_the_same_forty_strings(entry, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths name nothing here
    assert _mismatches(entry, tmp_path) == []


def test_a_second_grammar_at_one_entry_point_is_caught(tmp_path, monkeypatch):
    """Negative control: the service's old zoo pattern (it admitted seed-07) and its old random pattern (no JSON
    values) put back in front of the allow-list make the comparison fail on exactly those strings."""
    import re

    from circuitstat.pipelines.service import sources as service_sources

    old_zoo = re.compile(r"zoo:([a-z0-9][a-z0-9-]{0,63})/seed-([0-9]{1,6})")
    old_random = re.compile(r"random:[a-z0-9_]{1,32}(\?[A-Za-z0-9_.=&+-]{0,1000})?")
    real = service_sources.allowed_source

    def two_grammars(source, sources):
        zoo = old_zoo.fullmatch(source) if isinstance(source, str) else None
        if zoo is not None and zoo.group(1) in sources.zoo:
            return source
        if isinstance(source, str) and source.startswith("random:") and not old_random.fullmatch(source):
            raise InputError("model source is not allowed on this server")
        return real(source, sources)

    monkeypatch.setattr("circuitstat.pipelines.service.submission.allowed_source", two_grammars)
    monkeypatch.chdir(tmp_path)
    assert set(_mismatches("service", tmp_path)) == {"zoo:attn-only-2l/seed-07", RUNNABLE[3], f"{GPT2} "}


def test_the_grammar_quotes_none_of_the_text_and_imports_no_torch():
    """Refusals may be read from files someone else wrote: they never echo the string; the module is torch-free
    (the service's API process parses with it)."""
    for s in ("zoo:SECRET/seed-07", "SECRET:x", " SECRET", "served:SECRET/x", "hf:SECRET"):
        with pytest.raises(InputError) as e:
            parse_source(s)
        assert "SECRET" not in str(e.value)
    code = "import sys, circuitstat.circuits.model_source, circuitstat.circuits.families; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"


def test_a_bare_org_name_is_the_directory_when_one_exists_else_a_hub_id(tmp_path):
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert parse_source("org/name", base=tmp_path) == Dir("org/name", "org/name")
    assert parse_source("org/name") == Hub("org/name", "org/name", None)
    assert parse_source("org/other@v1", base=tmp_path) == Hub("org/other@v1", "org/other", "v1")
    assert parse_source("zoo:attn-only-2l/seed-12") == Zoo("zoo:attn-only-2l/seed-12", "attn-only-2l", 12)
