"""`attribute --scheduler` (issue 36 item 3): the chunks run on a Dask cluster's workers and are checkpointed by
the client, so the scores equal one process's bit for bit, a worker lost mid-run costs only its chunks, and a
killed run resumes from the chunks it stored. The cluster is a LocalCluster of in-process workers (a remote one
differs only in the transport)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from circuitstat.core.errors import InputError
from circuitstat.pipelines import checkpoint
from circuitstat.pipelines.runs.attribute.run import run_attribute
from circuitstat.pipelines.checkpoint import CheckpointStore

pytestmark = pytest.mark.slow

MODEL = "random:gpt2?n_layer=2&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=3"
ARGS = {"method": "eap", "n": 12, "batch_size": 2, "seed": 5}  # six chunks of one batch each


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address=None) as c:
        yield c


@pytest.fixture(scope="module")
def serial(tmp_path_factory) -> np.ndarray:
    return run_attribute(MODEL, "induction", tmp_path_factory.mktemp("serial") / "run", **ARGS).scores


class Calls:
    """The chunks _score_chunk computes, recorded as marker files wherever it runs (Dask pickles the function
    it ships, so a list in a closure would fill on the worker's copy)."""

    def __init__(self, folder):
        self.folder = folder
        folder.mkdir()

    def __call__(self) -> list:
        return sorted(tuple(int(x) for x in p.name.split("-")[:2]) for p in self.folder.iterdir())


def _count_chunks(monkeypatch, folder) -> Calls:
    calls, real = Calls(folder), checkpoint._score_chunk

    def counted(bounds, *args):
        (folder / f"{bounds[0]}-{bounds[1]}-{uuid.uuid4().hex}").touch()  # a repeat is a second file
        return real(bounds, *args)

    monkeypatch.setattr(checkpoint, "_score_chunk", counted)
    return calls


def test_scores_on_a_cluster_equal_one_process_bit_for_bit(tmp_path, cluster, serial, monkeypatch):
    calls = _count_chunks(monkeypatch, tmp_path / "calls")
    scores = run_attribute(MODEL, "induction", tmp_path / "run", scheduler=cluster.scheduler_address, **ARGS).scores
    assert np.array_equal(scores, serial)
    assert calls() == [(a, a + 2) for a in range(0, 12, 2)]  # each chunk once, none skipped
    assert not (tmp_path / "run" / "checkpoints").exists()  # redundant once the scores table is committed


def test_the_model_travels_to_each_worker_once_not_with_every_chunk(tmp_path, cluster, monkeypatch):
    from distributed import Client

    import pickle

    from circuitstat.pipelines.parallel import Packed

    scattered, submitted = [], []
    real_scatter, real_submit = Client.scatter, Client.submit
    monkeypatch.setattr(Client, "scatter", lambda self, data, **kw: scattered.append((data, kw))
                        or real_scatter(self, data, **kw))
    monkeypatch.setattr(Client, "submit", lambda self, fn, *a, **kw: submitted.append(a) or real_submit(self, fn, *a, **kw))
    run_attribute(MODEL, "induction", tmp_path / "run", scheduler=cluster.scheduler_address, **ARGS)
    # every non-scalar argument travels as bytes (a worker's copy of a live torch module can change while Dask
    # copies it to another worker), the model once
    assert scattered and all(isinstance(data, Packed) for data, _ in scattered)
    assert [type(pickle.loads(data.blob)).__name__ for data, _ in scattered].count("CircuitModel") == 1
    assert all(kw.get("broadcast") for _, kw in scattered)
    assert len(submitted) == 6
    assert not any(type(a).__name__ in ("CircuitModel", "Packed", "bytes") for args in submitted for a in args)  # futures


def test_a_packed_argument_is_unpickled_once_per_worker_and_token(monkeypatch):
    import pickle

    import circuitstat.pipelines.parallel as parallel

    loads, real = [], pickle.loads
    monkeypatch.setattr(pickle, "loads", lambda b: loads.append(1) or real(b))
    monkeypatch.setattr(parallel, "_UNPACKED", {})
    a, b = parallel.Packed.of({"w": [1.0, 2.0]}), parallel.Packed.of({"w": [1.0, 2.0]})
    first = parallel.unpacked(a)
    assert first == {"w": [1.0, 2.0]} and parallel.unpacked(a) is first and len(loads) == 1  # cached per token
    assert parallel.unpacked(b) is not first and len(loads) == 2  # another run's argument: its own object
    assert parallel.unpacked(3) == 3  # scalars travel as they are
    for _ in range(parallel._UNPACKED_MAX + 2):  # a long-lived cluster does not keep every run's model
        parallel.unpacked(parallel.Packed.of(0))
    assert len(parallel._UNPACKED) == parallel._UNPACKED_MAX


def test_a_worker_lost_mid_run_costs_only_its_chunks(tmp_path, serial, monkeypatch):
    """A worker closed abruptly after the first stored chunk: its in-flight chunk is recomputed on the other."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address=None) as c:
        real_write = CheckpointStore.write
        written = []

        def write_then_lose_a_worker(self, start, stop, scores):
            real_write(self, start, stop, scores)
            written.append((start, stop))
            if len(written) == 1:
                victim = next(iter(c.workers.values()))
                c.sync(victim.close, timeout=5)

        monkeypatch.setattr(CheckpointStore, "write", write_then_lose_a_worker)
        scores = run_attribute(MODEL, "induction", tmp_path / "run", scheduler=c.scheduler_address, **ARGS).scores
        assert len(c.scheduler.workers) == 1  # the loss did happen
    assert np.array_equal(scores, serial)
    assert sorted(written) == [(a, a + 2) for a in range(0, 12, 2)]


def test_a_killed_cluster_run_resumes_computing_only_the_missing_chunks(tmp_path, cluster, serial, monkeypatch):
    out = tmp_path / "run"
    real = checkpoint._score_chunk

    def dies_on_the_fourth(bounds, *args):
        if bounds[0] == 6:
            raise RuntimeError("killed")  # the run stops mid-way (as a kill of the client would)
        return real(bounds, *args)

    with monkeypatch.context() as m:
        m.setattr(checkpoint, "_score_chunk", dies_on_the_fourth)
        with pytest.raises(RuntimeError, match="killed"):
            run_attribute(MODEL, "induction", out, scheduler=cluster.scheduler_address, **ARGS)
    stored = {p.name for p in (out / "checkpoints").glob("*/rows-*.npy")}
    assert "rows-000006-000008.npy" not in stored and stored  # the finished chunks were stored by the client
    calls = _count_chunks(monkeypatch, tmp_path / "calls")
    scores = run_attribute(MODEL, "induction", out, scheduler=cluster.scheduler_address, **ARGS).scores
    assert np.array_equal(scores, serial)
    assert len(calls()) == 6 - len(stored) and (6, 8) in calls()


def test_an_unreachable_scheduler_is_refused_before_the_run_directory_exists(tmp_path, monkeypatch):
    monkeypatch.setattr("circuitstat.pipelines.parallel.CONNECT_TIMEOUT_S", 1)
    with pytest.raises(InputError, match="cannot reach the Dask scheduler"):
        run_attribute(MODEL, "induction", tmp_path / "run", scheduler="tcp://127.0.0.1:9", **ARGS)
    assert not (tmp_path / "run").exists()
