"""Which failures are the user's: the one-line message of a user-caused error, or None for a bug.

The command line (exit 2 and one line) and the service's workers (a job that failed on its input) classify
an exception the same way, so a job's error reads as the command's would.
"""

from __future__ import annotations

import json
import sys


def user_error_message(exc: BaseException) -> str | None:
    """The one-line message of a user-caused failure (bad input, paths, locks, an unreachable
    scheduler), or None when ``exc`` is an internal error (a bug)."""
    from pydantic import ValidationError

    from circuitstat.core.errors import InputError

    if isinstance(exc, InputError):
        return str(exc)
    if isinstance(exc, ValidationError):
        errs = exc.errors()
        return "invalid value: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in errs[:5])
    if isinstance(exc, OSError):
        # FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, a full or
        # read-only disk, a refused connection: the user's paths or environment, not a bug
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        what = exc.strerror or str(exc) or type(exc).__name__
        return f"{where}{what}; check the path, its permissions and the free space"
    if _is_run_error(exc):
        return str(exc)
    io = _safetensors_io_error(exc)
    if io is not None:  # safetensors' own error type for a failed read or write (a full or read-only disk)
        return (f"a safetensors file could not be written or read ({io}); check the path, its permissions and "
                "the free space")
    if isinstance(exc, (UnicodeDecodeError, json.JSONDecodeError)) or _is_arrow_error(exc):
        # a user's file that is not what it claims to be (text, JSON, Parquet); contents not echoed
        return f"a file could not be read ({type(exc).__name__}); check that it is the kind of file the option expects"
    return None


def _safetensors_io_error(exc: BaseException) -> str | None:
    """The I/O part of a safetensors error ("No space left on device (os error 28)"), or None when
    ``exc`` is not safetensors' error about reading or writing a file (then it is a bug)."""
    if type(exc).__name__ != "SafetensorError":
        return None
    text = str(exc)
    marker = "I/O error:"
    return " ".join(text.split(marker, 1)[1].split())[:200] if marker in text else None


def _is_arrow_error(exc: BaseException) -> bool:
    """True for pyarrow's errors reading a file (a Parquet of the wrong schema, a truncated one)."""
    pa = sys.modules.get("pyarrow")
    return pa is not None and isinstance(exc, pa.lib.ArrowException)


def _is_run_error(exc: BaseException) -> bool:
    """True for the run directory's refusals (a different spec, a lock held by another run)."""
    from circuitstat.core.lock import RunLockedError
    from circuitstat.core.rundir import RunDirError

    return isinstance(exc, (RunDirError, RunLockedError))
