import math

import pytest
import torch

from circuitstat.circuits.metrics import METRICS, Metric, MetricError, get_metric, last_token_logits
from circuitstat.circuits.tasks import Task

V = 4


def _task(**kw):
    # two examples; row 0 has 3 real tokens, row 1 has 2 (right padding)
    base = dict(
        name="toy",
        clean=torch.tensor([[1, 2, 3], [1, 2, 0]]),
        corrupted=torch.tensor([[1, 3, 3], [1, 3, 0]]),
        attention_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]),
        answer=torch.tensor([0, 2]),
        wrong_answer=torch.tensor([1, 3]),
    )
    base.update(kw)
    return Task(**base)


def _logits():
    x = torch.full((2, 3, V), 100.0)  # junk everywhere except the last real tokens
    x[0, 2] = torch.tensor([2.0, 0.0, 1.0, -1.0])
    x[1, 1] = torch.tensor([0.0, 1.0, 3.0, 0.5])
    return x


def _p(row):
    e = [math.exp(v) for v in row]
    s = sum(e)
    return [v / s for v in e]


ROWS = [[2.0, 0.0, 1.0, -1.0], [0.0, 1.0, 3.0, 0.5]]


def test_reads_last_real_token():
    t = _task()
    x = last_token_logits(_logits(), t)
    assert torch.equal(x, torch.tensor(ROWS))
    assert torch.equal(last_token_logits(x, t), x)  # [B, V] passes through


def test_logit_diff_hand_computed():
    out = get_metric("logit_diff")(_logits(), _task())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([2.0 - 0.0, 3.0 - 0.5]))


def test_prob_diff_hand_computed():
    p0, p1 = _p(ROWS[0]), _p(ROWS[1])
    out = get_metric("prob-diff")(_logits(), _task())
    torch.testing.assert_close(out, torch.tensor([p0[0] - p0[1], p1[2] - p1[3]]))


def test_prob_diff_candidate_sets():
    good = torch.tensor([[False, True, True, False], [False, False, False, True]])
    bad = ~good
    t = _task(candidates=torch.tensor([0, 1, 2, 3]), good=good, bad=bad)
    p0, p1 = _p(ROWS[0]), _p(ROWS[1])
    out = get_metric("prob_diff")(_logits(), t)
    exp0 = (p0[1] + p0[2]) - (p0[0] + p0[3])
    exp1 = p1[3] - (p1[0] + p1[1] + p1[2])
    torch.testing.assert_close(out, torch.tensor([exp0, exp1]))


def test_kl_sum_and_mean_hand_computed():
    clean = _logits()
    clean[0, 2] = torch.tensor([0.0, 0.0, 0.0, 0.0])  # uniform target for row 0
    q0, p0 = [0.25] * 4, _p(ROWS[0])
    kl0 = sum(q * (math.log(q) - math.log(p)) for q, p in zip(q0, p0))
    out = get_metric("kl")(_logits(), _task(), clean_logits=clean)
    torch.testing.assert_close(out, torch.tensor([kl0, 0.0]), atol=1e-6, rtol=1e-5)
    mean = get_metric("kl_mean")(_logits(), _task(), clean_logits=clean)
    torch.testing.assert_close(mean, out / V)
    assert get_metric("kl", reduction="mean").name == "kl_mean"
    with pytest.raises(MetricError, match="clean_logits"):
        get_metric("kl")(_logits(), _task())


def test_cross_entropy_hand_computed():
    out = get_metric("ce")(_logits(), _task())
    torch.testing.assert_close(out, torch.tensor([-math.log(_p(ROWS[0])[0]), -math.log(_p(ROWS[1])[2])]))


@pytest.mark.parametrize("name", sorted(METRICS))
def test_metrics_are_differentiable(name):
    x = _logits().requires_grad_(True)
    clean = torch.randn(2, 3, V)
    out = get_metric(name)(x, _task(), clean_logits=clean)
    (g,) = torch.autograd.grad(out.sum(), x)
    assert g[0, 2].abs().sum() > 0 and g[1, 1].abs().sum() > 0
    assert g[1, 2].abs().sum() == 0 and g[0, :2].abs().sum() == 0  # padding / earlier tokens: no gradient


def test_indices_select_rows_of_the_task():
    t = _task()
    x = _logits()[1:]  # only example 1
    out = t.score(x, indices=torch.tensor([1]))
    torch.testing.assert_close(out, torch.tensor([2.5]))
    with pytest.raises(MetricError, match="rows"):
        t.score(x)  # one row of logits, two examples, no indices


def test_user_callable_and_checks():
    def my_metric(logits, batch):
        return last_token_logits(logits, batch)[:, 0]

    m = get_metric(my_metric)
    assert m.name == "user:my_metric"
    torch.testing.assert_close(m(_logits(), _task()), torch.tensor([2.0, 0.0]))
    t = _task(metric=my_metric)
    torch.testing.assert_close(t.score(_logits()[:1], indices=[0]), torch.tensor([2.0]))
    with pytest.raises(MetricError, match="shape"):
        get_metric(lambda logits, batch: logits.sum())(_logits(), _task())
    x = _logits()
    x[1, 1, 2] = float("nan")
    with pytest.raises(MetricError, match="NaN"):
        get_metric("logit_diff")(x, _task())
    with pytest.raises(MetricError, match="unknown metric"):
        get_metric("accuracy")
    assert isinstance(get_metric(get_metric("ce")), Metric)
