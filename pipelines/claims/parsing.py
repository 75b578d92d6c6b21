"""Reading a claims file: YAML through the strict reader, validated into a ClaimsFile, and every
validation error turned into one line that names the key, the claim and the fix (never the file's text
beyond the key names it got wrong)."""

from __future__ import annotations

import os
import re
from typing import Any

from pydantic import ValidationError

from circuitstat.core.errors import InputError

from ..yamlio import read_yaml_strict
from .claimsfile import KIND_MODELS, ClaimsFile
from .kinds import CLAIM_KINDS

__all__ = ["load_claims", "parse_claims"]


def _loc(loc: tuple) -> tuple[str, str | None]:
    """(readable location, claim kind in it) of a pydantic error location."""
    out, kind = "", None
    parts = list(loc)
    i = 0
    while i < len(parts):
        p = parts[i]
        if isinstance(p, int):
            out += f"[{p}]"
            # the discriminated union adds the tag after the index: claims[0].circuit_stability.min
            if i + 1 < len(parts) and parts[i + 1] in KIND_MODELS:
                kind = parts[i + 1]
                i += 1
        else:
            # a key from the file: quoted when it has spaces or control characters, so the
            # message stays one line and cannot carry terminal escapes
            text = str(p)
            out += ("." if out else "") + (text if text.isprintable() and text.split() == [text] else _short(text))
        i += 1
    return out or "(top level)", kind


def _did_you_mean(given: Any, known) -> str:
    """'did you mean 'x'? ' for the nearest known name (difflib), '' when none is near or ``given`` is no string."""
    import difflib

    close = difflib.get_close_matches(given, list(known), n=1, cutoff=0.6) if isinstance(given, str) else []
    return f"did you mean {close[0]!r}? " if close else ""


def _format_validation(exc: ValidationError, source: str, data: Any) -> str:
    parts = []
    errors = exc.errors(include_url=False)
    for err in errors[:6]:
        where, kind = _loc(tuple(err["loc"]))
        t, msg = err["type"], err["msg"]
        if t == "extra_forbidden":
            fields = list(KIND_MODELS[kind].model_fields if kind else ClaimsFile.model_fields)
            fields.sort(key=lambda f: f != "kind")
            msg = f"unknown key; {_did_you_mean(err['loc'][-1], fields)}allowed keys: {', '.join(fields)}"
        elif t == "missing":
            msg = "required key is missing"
        elif t == "invalid_key":
            where, msg = f"key {_short(err['loc'][-1])}", "keys must be strings (names such as 'claims')"
        elif t == "too_short" and where == "claims":
            msg = "list at least one claim"
        elif t == "union_tag_not_found":
            msg = f"every claim needs a 'kind'; kinds: {', '.join(CLAIM_KINDS)}"
        elif t == "union_tag_invalid" and isinstance(err.get("input"), dict):
            msg = f"unknown kind {err['input'].get('kind')!r}; {_did_you_mean(err['input'].get('kind'), CLAIM_KINDS)}" \
                  f"kinds: {', '.join(CLAIM_KINDS)}"
        elif t in ("model_attributes_type", "model_type", "dict_type") and where.startswith("claims["):
            msg = "each claim must be a mapping of keys (kind, method, ...), not " + type(err.get("input")).__name__
        elif t == "literal_error":
            msg = msg.replace("Input should be", "must be")
            if kind == "approximation" and where.endswith(".method"):
                msg += " (approximation compares an approximate method against exact)"
        elif t == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif t in ("int_type", "float_type", "string_type", "bool_type", "list_type"):
            msg = f"{msg.replace('Input should be', 'must be')} (got {type(err.get('input')).__name__} {_short(err.get('input'))})"
        m = re.match(r"claims\[(\d+)\]", where)
        if m and isinstance(data, dict) and isinstance(data.get("claims"), list):
            i = int(m.group(1))
            c = data["claims"][i] if i < len(data["claims"]) else None
            if isinstance(c, dict) and isinstance(c.get("name"), str):
                where += f" ({c['name'][:60]!r})"
        parts.append(f"{where}: {msg}")
    more = f" (and {len(errors) - 6} more)" if len(errors) > 6 else ""
    return f"invalid claims file {source}: " + "; ".join(parts) + more


def _short(v: Any, n: int = 40) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def parse_claims(data: Any, source: str = "<claims>") -> ClaimsFile:
    """A ClaimsFile from parsed YAML, or InputError naming each bad key and the allowed values."""
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {type(data).__name__}"
        raise InputError(
            f"invalid claims file {source}: the top level is {what}; it must be a mapping with "
            "'claims:' (a list of claims) and optionally 'run:' and 'spec:'"
        )
    try:
        cf = ClaimsFile.model_validate(data)
    except ValidationError as exc:
        raise InputError(_format_validation(exc, source, data)) from None
    except RecursionError:
        raise InputError(f"invalid claims file {source}: nested too deeply") from None
    cf._source = source
    return cf


def load_claims(path: str | os.PathLike[str]) -> ClaimsFile:
    """The validated claims file at `path` (InputError on any problem, naming the key and the fix)."""
    return parse_claims(read_yaml_strict(path), str(path))

