"""Edge-effect claims with an effect size (issue 47, item 2): ``min_abs`` on the interval's inner end (default) or
on the estimate; sign and q alone passed on random weights (estimate -4.6e-7, q = 0.013)."""

from __future__ import annotations

import pytest

from builders import make_run
from circuitstat.core.errors import InputError
from circuitstat.pipelines.claims import evaluate_claims, parse_claims


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("size") / "run")  # a0.h3->a1.h5<k>: 1.5 [1.3, 1.7]; input->a1.h5<k>: -0.5 [-0.7, -0.3]


POS = {"kind": "edge_effect", "edge": "a0.h3->a1.h5<k>", "method": "exact", "sign": "positive", "max_q": 0.05}
NEG = {"kind": "edge_effect", "edge": "input->a1.h5<k>", "method": "exact", "sign": "negative", "max_q": 0.05}


@pytest.mark.parametrize("claim, status", [
    ({**POS, "min_abs": 1.29}, "pass"), ({**POS, "min_abs": 1.31}, "fail"),  # inner end 1.3
    ({**POS, "min_abs": 1.49, "min_abs_of": "estimate"}, "pass"), ({**POS, "min_abs": 1.51, "min_abs_of": "estimate"}, "fail"),
    ({**NEG, "min_abs": 0.29}, "pass"), ({**NEG, "min_abs": 0.31}, "fail"),  # inner end -0.3
    ({**NEG, "sign": "nonzero", "min_abs": 0.29}, "pass"), ({**NEG, "sign": "nonzero", "min_abs": 0.31}, "fail"),
    ({**NEG, "min_abs": 0.49, "min_abs_of": "estimate"}, "pass"), ({**NEG, "min_abs": 0.51, "min_abs_of": "estimate"}, "fail"),
])
def test_min_abs_bounds_the_effect_size_from_both_sides(run, claim, status):
    (r,) = evaluate_claims(parse_claims({"claims": [claim]}), run)
    assert r.status == status, r.reason
    if status == "fail":
        assert "below the claimed effect size" in r.reason
    assert f">= {claim['min_abs']:g}" in r.bound


def test_without_min_abs_the_claim_is_as_before_and_a_negative_size_is_refused(run):
    (r,) = evaluate_claims(parse_claims({"claims": [POS]}), run)
    assert r.status == "pass" and "min_abs" not in r.bound and ">=" not in r.bound
    with pytest.raises(InputError, match="min_abs"):
        parse_claims({"claims": [{**POS, "min_abs": -0.1}]})
