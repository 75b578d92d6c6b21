"""The model-source allow-list: what a request may name as ``model:``, and what the server loads for it.

A request names one of:

* ``zoo:RECIPE/seed-S`` for a recipe the operator lists;
* ``random:ARCH?key=value&...`` when the operator allows it (sizes stay under the CLI's limits:
  ``--allow-large`` cannot be lifted from a request);
* a named local model, by the name the operator gave it; the spec then says ``served:NAME``, and the
  worker loads the directory or cached hub id the operator wrote (circuitstat.pipelines.sources.RunInputs), with
  ``allow_pickle=False`` always. The run records ``served:NAME`` as the model's source, never the path.

Anything else (a server path, ``~``, ``..``, a hub id the operator did not name, a pickle) is
refused before a job exists. The string is read by the one source grammar every entry point reads
(circuitstat.circuits.model_source.parse_source: no path segment can reach another directory, a zoo seed has no
leading zero); this module adds the operator's policy only.
"""

from __future__ import annotations

from circuitstat.circuits.model_source import SERVED_NAME, Dir, Random, Zoo, parse_source
from circuitstat.core.errors import InputError

from .config import SourcesConfig


def allowed_text(sources: SourcesConfig) -> str:
    """What this server accepts as a model source, for error messages."""
    parts = [f"zoo:{r}/seed-N" for r in sources.zoo]
    if sources.random:
        parts.append("random:ARCH?key=value&...")
    parts += sorted(sources.models)
    return ", ".join(parts) if parts else "(none: the operator allows no model sources)"


def allowed_source(source: object, sources: SourcesConfig) -> str:
    """The source a job's spec holds for the request's model source ``source`` (``served:NAME`` for a named
    model); InputError when the source grammar (circuitstat.circuits.model_source) refuses it, or when the
    operator's allow-list does not name it (policy only: the grammar is the one every entry point reads)."""
    if not isinstance(source, str):
        raise InputError(f"a model source must be a string; this server accepts {allowed_text(sources)}")
    src = parse_source(source)  # no base: a bare org/name is a hub id here, never a server path
    if isinstance(src, Zoo) and src.recipe in sources.zoo:
        return source
    if isinstance(src, Random) and sources.random:
        return source
    # a request names an operator's model by its bare name (served:NAME is what the spec then holds, not a request)
    if isinstance(src, Dir) and source in sources.models:  # the worker resolves it (circuitstat.pipelines.sources)
        return f"served:{source}"
    shown = source if len(source) <= 80 else source[:77] + "..."
    raise InputError(f"model source {shown!r} is not allowed on this server (a request cannot name a server "
                     f"path, a pickle or an unlisted model); it accepts {allowed_text(sources)}")


def check_config(sources: SourcesConfig) -> None:
    """None; InputError when the operator's allow-list names an unknown zoo recipe or a bad model name."""
    from circuitstat.pipelines.zoo import ZOO_RECIPES

    unknown = [r for r in sources.zoo if r not in ZOO_RECIPES]
    if unknown:
        raise InputError(f"sources.zoo names unknown recipes {unknown}; recipes: {', '.join(ZOO_RECIPES)}")
    for name in sources.models:
        if not SERVED_NAME.fullmatch(name) or name.startswith(("zoo", "random")):
            raise InputError(f"sources.models: {name!r} is not a model name; use letters, digits, '.', '_' and '-' "
                             "(not starting with zoo or random)")
