"""A property of every parser a user's text reaches (issue 45, acceptance): random ``random:`` source strings,
spec mappings of every served run kind and JSON circuit files either parse or fail with an error the CLI reports
as bad input (exit 2, circuitstat.pipelines.errors.user_error_message), never an internal error (exit 3).
Parse-level and in-process: no model runs; a handful of examples per property keeps it cheap."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from circuitstat.pipelines.errors import user_error_message

PROPERTY = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def _exit_2_or_success(fn, *args, **kwargs) -> None:
    """Call ``fn``; an exception must be one the CLI turns into exit 2 with a one-line message."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the property: which exceptions reach the user
        message = user_error_message(exc)
        assert message is not None, f"exit 3 from {type(exc).__name__}: {exc}"
        assert "\n" not in message.strip() or len(message) < 2000


VALUES = st.one_of(
    st.sampled_from(["1", "2", "0", "-1", "64", "1e3", "1.5", "true", "none", "x", "nan", "inf", "9" * 30, "",
                     '{"rope_type":"linear","factor":2}', '{"factor":', "[" * 60, '{"a":{"b":{"c":1}}}', "[1,2]",
                     "linear", "gelu", "%00", "%7B%7D"]),
    st.text(alphabet=st.characters(codec="ascii", exclude_characters="&#"), max_size=10))
KEYS = st.sampled_from(["n_layer", "n_head", "n_embd", "vocab_size", "n_positions", "num_hidden_layers", "hidden_size",
                        "num_attention_heads", "num_key_value_heads", "intermediate_size", "max_position_embeddings",
                        "rope_scaling", "rope_parameters", "rope_parameters.factor", "rope_scaling.rope_type",
                        "rope_parameters.full_attention.factor", "seed", "activation_function", "bogus.key", "tie",
                        "n_inner", "layer_norm_epsilon", "rope_theta"])
SOURCES = st.builds(
    lambda arch, pairs: f"random:{arch}" + ("?" + "&".join(f"{k}={v}" for k, v in pairs) if pairs else ""),
    st.sampled_from(["gpt2", "llama", "qwen2", "bogus", "", "GPT2"]),
    st.lists(st.tuples(KEYS, VALUES), max_size=3))


@PROPERTY
@given(source=SOURCES)
def test_random_source_strings_parse_or_exit_2(source):
    from circuitstat.pipelines.sources import LOCAL

    _exit_2_or_success(LOCAL.skeleton, source, weights=False)


LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.integers(-3, 3),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                 st.sampled_from(["exact", "eap", "ugs", "edge-pruning", "induction", "a0.h0->logits", "50,50"]))
SPEC_VALUES = st.recursive(LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                           max_leaves=8)
BASES = {
    "attribute": {"model": "random:gpt2"},
    "audit": {"model": "random:gpt2", "methods": ["eap"]},
    "study variance": {"model": "random:gpt2"},
    "study calibration": {"model": "random:gpt2", "sizes": [32], "method": "eap"},
}
SPEC_KEYS = ["model", "task", "method", "methods", "n", "verify", "ugs", "edge_pruning", "n_refits", "tests",
             "bootstrap", "k", "seed", "batch_size", "ig_steps", "sizes", "n_datasets", "estimators", "counterfactual",
             "level", "task_options", "moe_nodes", "circuit", "heads", "max_memory"]
SECTION_VALUES = st.fixed_dictionaries({}, optional={
    "steps": LEAF, "n_samples": LEAF, "n_refits": LEAF, "seed": LEAF, "n": LEAF, "k": LEAF, "n_random": LEAF,
    "n_permutations": LEAF, "edges": SPEC_VALUES, "tau": LEAF, "lr": LEAF})


@PROPERTY
@given(kind=st.sampled_from(sorted(BASES)),
       changes=st.dictionaries(st.sampled_from(SPEC_KEYS), st.one_of(SPEC_VALUES, SECTION_VALUES), max_size=3))
def test_spec_mappings_of_every_served_kind_parse_or_exit_2(kind, changes):
    from circuitstat.pipelines.kinds import kind as run_kind

    _exit_2_or_success(run_kind(kind).parse, {**BASES[kind], **changes}, "<fuzz>")


def _graph_doc():
    from circuitstat.circuits.circuit import Circuit
    from circuitstat.circuits.graph import ComponentGraph

    g = ComponentGraph(2, 2)
    return g, Circuit.from_edges(g, g.edge_names[:4]).to_json(d_model=16)


JSON_VALUES = st.recursive(LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                           max_leaves=10)


@PROPERTY
@given(where=st.sampled_from(["doc", "cfg", "nodes", "edges", "entry", "in_graph", "score", "text"]),
       value=JSON_VALUES, text=st.text(max_size=40), duplicate=st.booleans())
def test_json_circuit_files_read_or_exit_2(tmp_path_factory, where, value, text, duplicate):
    from circuitstat.pipelines.published import read_circuit_file

    g, doc = _graph_doc()
    first = g.edge_names[0]
    if where == "doc":
        doc = value
    elif where in ("cfg", "nodes", "edges"):
        doc[where] = value
    elif where == "entry":
        doc["edges"][first] = value
    elif where in ("in_graph", "score"):
        doc["edges"][first][where] = value
    body = text if where == "text" else json.dumps(doc, allow_nan=True)
    if duplicate and body.endswith("}"):
        body = body[:-1] + ', "edges": {}}'
    path = tmp_path_factory.mktemp("circuit") / "c.json"
    path.write_text(body)
    for fmt in ("eap-ig", "edges"):
        _exit_2_or_success(read_circuit_file, path, fmt, g)


@pytest.mark.parametrize("body", ["[" * 200_000, '{"cfg": 1' + "0" * 5001 + "}", "{}{}{}"])
def test_the_issues_circuit_files_exit_2(tmp_path, body):
    from circuitstat.circuits.graph import ComponentGraph
    from circuitstat.pipelines.published import read_circuit_file

    path = tmp_path / "c.json"
    path.write_text(body)
    _exit_2_or_success(read_circuit_file, path, "eap-ig", ComponentGraph(2, 2))
