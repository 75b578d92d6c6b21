"""circuitstat: statistical circuit discovery and stability audits of transformer language models.

The hello-world is one import::

    from circuitstat import load_model, build_task, attribute, bootstrap_edges, circuit_stability, Circuit

The layers install under this one root, so a user's own ``stats.py`` or ``reports/`` folder never shadows
them: ``circuitstat.core`` (the contracts and the run-directory store), ``circuitstat.circuits`` (models,
graph, tasks, attribution, circuits), ``circuitstat.stats`` (statistics on arrays),
``circuitstat.pipelines`` (specs, studies, claims, the CLI and the service) and ``circuitstat.reports``
(the HTML report and verdicts). Names load lazily (PEP 562): ``import circuitstat`` imports no torch.
"""

from __future__ import annotations

from circuitstat.core.lazy import lazy_names

_MODULES = {
    ".circuits.loading": ["load_model"],
    ".circuits.attribution": ["attribute"],
    ".circuits.circuit": ["Circuit"],
    ".circuits.model": ["CircuitModel"],
    ".circuits.scores": ["ScoreMatrix"],
    ".pipelines.build": ["build_task"],
    ".stats.intervals": ["bootstrap_edges"],
    ".stats.stability": ["circuit_stability"],
    ".core.errors": ["InputError"],
    ".core.rundir": ["RunDir"],
}
__all__, __getattr__ = lazy_names(__name__, _MODULES)
