"""The ``circuitstat`` command line: every command lives in this package (analyse, studies, checks).

Exit codes (one policy for every command):

* 0  success;
* 1  a check or claim failed (the run itself worked);
* 2  bad input: a one-line ``error: ...`` on stderr naming the problem and the fix, and nothing
     written (every option, spec and source is validated before a run directory is created);
* 3  an internal error, i.e. a bug in circuitstat: the traceback and a line saying so;
* 130 interrupted (Ctrl-C); rerunning the same command resumes from the finished stages;
* 143 terminated (SIGTERM): the same cleanup as an interrupt, then a line saying so;
* 141 the reader of the output closed it (``circuitstat --help | head``): no message, as other tools.
"""

from __future__ import annotations

import sys

import typer

from circuitstat.pipelines.errors import user_error_message

from .app import (EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK, EXIT_PIPE, EXIT_TERMINATED, Terminated, one_line, usage_message, app,
                  echo, reader_gone, study_app, terminal_text)

__all__ = ["app", "echo", "main", "study_app", "terminal_text", "user_error_message"]

# the commands register themselves on `app` / `study_app` when their modules are imported; each
# imports what it runs inside its body, so `circuitstat --help`, `check` and `query` never load torch
from . import analyse, checks, studies  # noqa: E402,F401
from . import export, published, tokens, zoo  # noqa: E402,F401
from . import service  # noqa: E402,F401
from . import compare  # noqa: E402,F401
from . import sample_size  # noqa: E402,F401
from . import scripts  # noqa: E402,F401


def main() -> None:
    """Entry point: run the app; exits with the documented codes (see the module docstring)."""
    from circuitstat.circuits.allocator import reuse_freed_memory

    reuse_freed_memory()  # a command computes and exits: freed tensor memory is reused, not page-faulted again
    _terminate_like_interrupt()
    _old_names_as_one_line()
    command = typer.main.get_command(app)
    to_devnull = _stdout_is_devnull()
    try:
        code = command.main(prog_name="circuitstat", standalone_mode=False)
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.TyperException as exc:  # before any command runs: an unknown command or top-level option
        typer.echo(f"error: {one_line(usage_message(exc))}", err=True)
        code = EXIT_INPUT
    except Terminated:
        typer.echo("error: terminated (SIGTERM); rerun the same command to resume", err=True)
        code = EXIT_TERMINATED
    except (KeyboardInterrupt, typer.Abort):
        typer.echo("error: interrupted; rerun the same command to resume", err=True)
        code = EXIT_INTERRUPTED
    except SystemExit as exc:  # rich's and click's own answer to a closed pipe (help is printed before any
        if exc.code != 1 or not _pipe_closed(to_devnull):  # boundary): exit 1, which reads as "a check failed"
            raise
        code = EXIT_PIPE
    try:
        sys.stdout.flush()  # a reader that left after our last write: found here, not in Python's exit
    except BrokenPipeError:
        try:
            reader_gone()
        except typer.Exit as exc:
            code = exc.exit_code
    sys.exit(code if isinstance(code, int) else EXIT_OK)


def _stdout_is_devnull() -> bool:
    """Whether file descriptor 1 is /dev/null (False when it cannot be told)."""
    import os

    try:
        a, b = os.fstat(1), os.stat(os.devnull)
    except (OSError, ValueError):
        return False
    return (a.st_dev, a.st_ino, a.st_rdev) == (b.st_dev, b.st_ino, b.st_rdev)


def _pipe_closed(was_devnull: bool) -> bool:
    """Whether rich (stdout moved to /dev/null) or click (stdout wrapped) gave up on a closed pipe."""
    return type(sys.stdout).__name__ == "PacifyFlushWrapper" or (not was_devnull and _stdout_is_devnull())


def _old_names_as_one_line() -> None:
    """Print every Python warning as one ``warning:`` line (a renamed option's names the user's option and its new
    name), once per message, not as Python's ``file:line: category`` with a line of circuitstat's source, and not
    again when another call site raises the same message."""
    import warnings

    seen: set[tuple[type, str]] = set()

    def show(message, category, filename, lineno, file=None, line=None):
        text = one_line(str(message))
        if (category, text) in seen:
            return
        seen.add((category, text))
        plain = category in (UserWarning, RuntimeWarning) or category.__module__.startswith("circuitstat")
        typer.echo(f"warning: {text}" if plain else f"warning ({category.__name__}): {text}", err=True)

    warnings.showwarning = show


def _terminate_like_interrupt() -> None:
    """Turn SIGTERM into :class:`Terminated` in the main thread, so a terminated command cleans up (run
    directory lock, temporary files, the manifest of a failed stage) and exits 143 with a line saying
    so, instead of dying at once with no word (-15)."""
    import signal

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
        raise Terminated()

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # pragma: no cover - not the main thread
        pass


if __name__ == "__main__":
    main()
