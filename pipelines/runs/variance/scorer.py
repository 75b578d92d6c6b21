"""Where the study's score matrices come from: one :class:`Key` per matrix, and :class:`ModelScorer`
(attribution of the spec's models on its task and counterfactual draws; tests plug in generators
with planted effects through the :class:`Scorer` protocol)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from circuitstat.circuits.counterfactuals import counterfactual_corruptions, with_counterfactual
from circuitstat.core.errors import InputError
from circuitstat.core.seeds import spawn_seeds

from circuitstat.pipelines.sources import LOCAL, RunInputs
from circuitstat.pipelines.runs.variance.spec import VarianceSpec, spec_view

__all__ = ["Key", "Scorer", "ModelScorer"]


@dataclass(frozen=True)
class Key:
    """One score matrix of the study: model seed, dataset draw, counterfactual draw, estimator level."""

    seed: int
    dataset: int
    draw: int
    estimator: str

    @property
    def name(self) -> str:
        return f"scores_s{self.seed}_d{self.dataset}_c{self.draw}_{self.estimator.replace('@', '-')}"


class Scorer(Protocol):
    """Where score matrices come from (ModelScorer; tests plug in generators with planted effects)."""

    names: list[str]
    index_table: Any

    def n_obs(self, dataset: int) -> int: ...
    def groups(self, dataset: int) -> np.ndarray | None: ...
    def params(self, key: Key) -> dict: ...
    def score_table(self, key: Key, n_jobs: int) -> Any: ...


class ModelScorer:
    """Score matrices from the spec's models and task (attribution in fixed chunks, any n_jobs)."""

    has_model = True

    def __init__(self, spec: VarianceSpec, seed_of, *, allow_pickle: bool = False, allow_large: bool = False,
                 inputs: RunInputs = LOCAL) -> None:
        from circuitstat.circuits.scores import ScoreMatrix

        from circuitstat.pipelines.build import build_task

        self.spec, self._seed_of = spec, seed_of
        self._load = dict(device=spec.device, dtype=spec.dtype, allow_pickle=allow_pickle, allow_large=allow_large)
        self._inputs = inputs
        self._models: dict[int, Any] = {0: inputs.load(spec.sources[0], **self._load)}
        m0 = self.model(0)
        t = spec.task
        self._opts = dict(t.options)
        self._build = lambda j: build_task(m0, t.name, n=t.n, seed=t.seed + j, metric=t.metric, **self._opts)
        self._tasks: dict[int, Any] = {0: self._build(0)}
        self._draws: list | None = None
        n_cols = m0.graph.n_edges if spec.level == "edge" else m0.graph.n_senders
        sm0 = ScoreMatrix(np.zeros((1, n_cols), np.float32), m0.graph, spec.level, "none", "counterfactual", "none")
        self.names = sm0.names
        self.index_table = sm0.tables()["edges" if spec.level == "edge" else "nodes"]
        self.provenance = {"model": m0.identity(), "task": self.task(0).describe()}

    def model(self, s: int):
        if s not in self._models:
            m = self._inputs.load(self.spec.sources[s], **self._load)
            if m.graph.edge_names != self._models[0].graph.edge_names:
                raise InputError(f"model {self.spec.sources[s]} has a different component graph from "
                                 f"{self.spec.sources[0]}; the seeds of a study must share one architecture")
            self.task(0).validate(m)
            self._models[s] = m
        return self._models[s]

    def task(self, j: int):
        if j not in self._tasks:
            self._tasks[j] = self._build(j)
        return self._tasks[j]

    def n_obs(self, dataset: int) -> int:
        return int(self.task(dataset).clean.shape[0])

    def groups(self, dataset: int):
        t = self.task(dataset)
        return None if t.group is None else t.group.numpy()

    def draws(self) -> list:
        if self._draws is None:
            m, t = self.model(0), self.task(0)
            tok, opts = m.tokenizer, self._opts
            if "token_pool" in t.meta:  # the induction task's own candidates
                pool = np.asarray(t.meta["token_pool"], dtype=np.int64)
            else:  # as induction_task: the vocabulary without special tokens
                special = [] if tok is None else [i for i in (tok.bos_id, tok.eos_id, getattr(tok, "pad_id", None))
                                                   if i is not None]
                vocab = int(opts.get("vocab_size") or (tok.vocab_size if tok is not None else m.cfg.vocab_size))
                pool = np.setdiff1d(np.arange(vocab), np.asarray(special, dtype=np.int64))
            # draw c's randomness is child c of the stage seed (draw 0 is the task's own)
            draw_seeds = spawn_seeds(self._seed_of("counterfactual"), self.spec.counterfactual.n_draws)[1:]
            self._draws = counterfactual_corruptions(t, self.spec.counterfactual.scheme, draw_seeds, pool)
        return self._draws

    def params(self, key: Key) -> dict:
        import hashlib

        spec = self.spec
        label, method, steps = next(x for x in spec.estimator_levels() if x[0] == key.estimator)
        p = {"model": spec.sources[key.seed], "weight_hash": self.model(key.seed).weight_hash(),
             "task": spec.task.model_dump(), "task_hash": self.task(key.dataset).content_hash, "dataset": key.dataset,
             "method": method, "ig_steps": steps, "level": spec.level, "batch_size": spec.batch_size,
             "seed": spec.seed, "draw": key.draw}
        if key.draw:
            p["counterfactual"] = {"scheme": spec.counterfactual.scheme,
                                   "ids_sha256": hashlib.sha256(np.ascontiguousarray(self.draws()[key.draw]).tobytes()).hexdigest()}
        return p

    def score_table(self, key: Key, n_jobs: int):
        from circuitstat.pipelines.runs.audit.run import attribution_scores

        spec = self.spec
        label, method, steps = next(x for x in spec.estimator_levels() if x[0] == key.estimator)
        model, task = self.model(key.seed), self.task(key.dataset)
        if key.draw:
            task = with_counterfactual(task, self.draws()[key.draw])
        sm = attribution_scores(model, task, method, spec_view(spec, ig_steps=steps), n_jobs)
        sm.method = label
        return sm.tables({"task": task.describe(), "study": {"seed": key.seed, "dataset": key.dataset,
                                                             "draw": key.draw, "estimator": label}})["scores"]
