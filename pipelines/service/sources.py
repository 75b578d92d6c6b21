"""The model-source allow-list: what a request may name as ``model:``, and what the server loads for it.

A request names one of:

* ``zoo:RECIPE/seed-S`` for a recipe the operator lists (RECIPE and S are checked character by
  character: no path segment can reach another directory);
* ``random:ARCH?key=value&...`` when the operator allows it (sizes stay under the CLI's limits:
  ``--allow-large`` cannot be lifted from a request);
* a named local model, by the name the operator gave it; the spec then says ``served:NAME``, and the
  worker loads the directory or cached hub id the operator wrote (circuitstat.pipelines.build.served_sources), with
  ``allow_pickle=False`` always. The run records ``served:NAME`` as the model's source, never the path.

Anything else (a server path, ``~``, ``..``, a hub id the operator did not name, a pickle) is
refused before a job exists.
"""

from __future__ import annotations

import re

from circuitstat.core.errors import InputError

from .config import SourcesConfig

ZOO_SOURCE = re.compile(r"zoo:([a-z0-9][a-z0-9-]{0,63})/seed-([0-9]{1,6})")
RANDOM_SOURCE = re.compile(r"random:[a-z0-9_]{1,32}(\?[A-Za-z0-9_.=&+-]{0,1000})?")
MAX_SOURCE_CHARS = 1100


def _short(value: str, n: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 4] + "...'"


def allowed_text(sources: SourcesConfig) -> str:
    """What this server accepts as a model source, for error messages."""
    parts = [f"zoo:{r}/seed-N" for r in sources.zoo]
    if sources.random:
        parts.append("random:ARCH?key=value&...")
    parts += sorted(sources.models)
    return ", ".join(parts) if parts else "(none: the operator allows no model sources)"


def resolve_source(source: object, sources: SourcesConfig) -> str:
    """The source a job's spec holds for the request's model source ``source`` (``served:NAME`` for a named
    model); InputError when the operator's allow-list does not name it."""
    if not isinstance(source, str) or not source or len(source) > MAX_SOURCE_CHARS:
        raise InputError(f"a model source must be a short string; this server accepts {allowed_text(sources)}")
    zoo = ZOO_SOURCE.fullmatch(source)
    if zoo is not None and zoo.group(1) in sources.zoo:
        return source
    if RANDOM_SOURCE.fullmatch(source) is not None and sources.random:
        return source
    if source in sources.models:  # resolved by the worker (circuitstat.pipelines.build.served_sources): no path in the spec
        return f"served:{source}"
    raise InputError(f"model source {_short(source)} is not allowed on this server (a request cannot name a server "
                     f"path, a pickle or an unlisted model); it accepts {allowed_text(sources)}")


def check_config(sources: SourcesConfig) -> None:
    """None; InputError when the operator's allow-list names an unknown zoo recipe or a bad model name."""
    from circuitstat.pipelines.zoo import ZOO_RECIPES

    unknown = [r for r in sources.zoo if r not in ZOO_RECIPES]
    if unknown:
        raise InputError(f"sources.zoo names unknown recipes {unknown}; recipes: {', '.join(ZOO_RECIPES)}")
    for name in sources.models:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name) or name.startswith(("zoo", "random")):
            raise InputError(f"sources.models: {name!r} is not a model name; use letters, digits, '.', '_' and '-' "
                             "(not starting with zoo or random)")
