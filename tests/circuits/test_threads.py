"""Torch threads per call (circuitstat.circuits.threads): small calls on one thread unless the user chose otherwise.

No timing here (bench/threads.py measures the rule as ratios in one run; docs/benchmarks-threads.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

TINY = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=1"


@pytest.fixture
def default_threads(monkeypatch):
    """torch on a 2-thread default, as a fresh process on a 2-core machine (the test suite pins 1)."""
    import circuitstat.circuits.threads as th

    before = torch.get_num_threads()
    monkeypatch.setattr(th, "_AT_IMPORT", 2)
    monkeypatch.delenv(th.ENV, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(th.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(th.os, "getloadavg", lambda: (0.2, 0.2, 0.2))  # an idle machine
    torch.set_num_threads(2)
    yield th
    torch.set_num_threads(before)


def test_a_small_faithfulness_call_runs_on_one_thread_and_restores_the_setting(default_threads, monkeypatch):
    """Today: faithfulness(...) on a tiny model runs on torch's default threads (28 s against 0.6 s on a
    loaded 2-core machine in issue 23)."""
    import circuitstat.circuits.faithfulness as fa
    from circuitstat.circuits import load_model
    from circuitstat.pipelines.build import build_task

    model = load_model(TINY)
    task = build_task(model, "induction", n=8, seq_len=4)
    seen = []
    real = fa._evaluate

    def spy(*a, **kw):
        seen.append(torch.get_num_threads())
        return real(*a, **kw)

    monkeypatch.setattr(fa, "_evaluate", spy)
    masks = np.random.default_rng(0).random((3, model.graph.n_edges)) < 0.5
    fa.faithfulness(model, task, masks, progress=False)
    assert seen == [1] and torch.get_num_threads() == 2


def test_the_rule_scales_with_work_and_respects_a_users_choice(default_threads, monkeypatch):
    th = default_threads
    assert th.threads_for(1e6) == 1 and th.threads_for(th.MIN_FLOPS_PER_THREAD * 1.5) == 1
    assert th.threads_for(th.MIN_FLOPS_PER_THREAD * 2) == 2 and th.threads_for(1e15) == 2  # never above the cores
    monkeypatch.setattr(th.os, "getloadavg", lambda: (3.5, 3.0, 3.0))  # other processes keep both cores busy
    assert th.threads_for(1e15) == 1
    monkeypatch.setattr(th.os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    monkeypatch.setenv(th.ENV, "3")
    assert th.threads_for(1e6) == 3  # CIRCUITSTAT_THREADS as given
    monkeypatch.delenv(th.ENV)
    torch.set_num_threads(1)  # a torch.set_num_threads of the user's (or the CLI's single_threaded)
    assert th.threads_for(1e15) == 1
    torch.set_num_threads(2)
    monkeypatch.setenv(th.ENV, "two")
    from circuitstat.core.errors import InputError

    with pytest.raises(InputError, match="CIRCUITSTAT_THREADS"):
        th.threads_for(1e6)
