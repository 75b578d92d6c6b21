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


def _exact_with_threads_seen(model, task, monkeypatch):
    """(scores, {Python thread's name: torch intra-op threads} seen by exact's suffix calls) of one exact run."""
    import threading

    from circuitstat.circuits.attribution import attribute

    cls, seen = type(model), {}
    real = cls.patched_layer_logits

    def spy(self, *a, **kw):
        # by name: a pool per call gives new threads (and idents) per call, named {prefix}_{i} in each pool
        seen.setdefault(threading.current_thread().name, set()).add(torch.get_num_threads())
        return real(self, *a, **kw)

    monkeypatch.setattr(cls, "patched_layer_logits", spy)
    scores = attribute(model, task, "exact", batch_size=4, max_rows=6, progress=False).scores
    monkeypatch.setattr(cls, "patched_layer_logits", real)
    return scores, seen


def test_exact_splits_its_suffix_calls_over_the_given_cores_with_bit_identical_scores(default_threads, monkeypatch):
    """Issue 38: exact patching left the second core of an idle 2-core machine idle (its suffix calls are each
    too small for a second intra-op thread). Its independent calls now run on two threads, one intra-op thread
    each, and the scores are bitwise those of one thread."""
    from circuitstat.circuits import load_model
    from circuitstat.pipelines.build import build_task

    th = default_threads
    model = load_model("random:gpt2?n_layer=3&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=1")
    task = build_task(model, "induction", n=8, seq_len=5)
    two, seen_two = _exact_with_threads_seen(model, task, monkeypatch)
    assert len(seen_two) == 2 and all(s == {1} for s in seen_two.values()), seen_two  # both cores, 1 thread each
    monkeypatch.setenv(th.ENV, "1")  # the user's choice: one thread
    one, seen_one = _exact_with_threads_seen(model, task, monkeypatch)
    assert len(seen_one) == 1
    assert one.dtype == two.dtype and np.array_equal(one.view(np.int32), two.view(np.int32))  # bit-identical
    monkeypatch.delenv(th.ENV)
    monkeypatch.setattr(th.os, "getloadavg", lambda: (3.5, 3.0, 3.0))  # other processes hold both cores
    assert len(_exact_with_threads_seen(model, task, monkeypatch)[1]) == 1
    monkeypatch.setattr(th.os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    from circuitstat.pipelines.parallel import single_threaded

    with single_threaded():  # the CLI's stages: one thread per worker, parallel over workers instead
        assert len(_exact_with_threads_seen(model, task, monkeypatch)[1]) == 1
    assert torch.get_num_threads() == 2


def test_attribute_sizes_its_threads_to_its_batch(monkeypatch):
    """attribute() runs its batches under sized_threads: the threads its FLOPs choose hold while the model runs (a
    refactor once moved the decorator onto an input-checking helper, and the model ran on the caller's threads)."""
    import circuitstat.circuits.threads as th
    from circuitstat.circuits import load_model
    from circuitstat.circuits.attribution import attribute
    from circuitstat.pipelines.build import build_task

    model = load_model("random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=32&seed=1")
    task = build_task(model, "induction", n=4, seq_len=4)
    during, real_run = [], type(model).run
    monkeypatch.setattr(type(model), "run", lambda self, *a, **k: during.append(torch.get_num_threads())
                        or real_run(self, *a, **k))
    monkeypatch.setattr(th, "threads_for", lambda flops: 1)  # what the sizing chooses
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the caller's setting, which the sizing must override while the model runs
    try:
        attribute(model, task, "eap", batch_size=2, progress=False)
    finally:
        torch.set_num_threads(before)
    assert during and set(during) == {1}
