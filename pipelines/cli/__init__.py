"""The ``circuitstat`` command line: every command lives in this package (analyse, studies, checks).

Exit codes (one policy for every command):

* 0  success;
* 1  a check or claim failed (the run itself worked);
* 2  bad input: a one-line ``error: ...`` on stderr naming the problem and the fix, and nothing
     written (every option, spec and source is validated before a run directory is created);
* 3  an internal error, i.e. a bug in circuitstat: the traceback and a line saying so;
* 130 interrupted (Ctrl-C); rerunning the same command resumes from the finished stages;
* 143 terminated (SIGTERM): the same cleanup as an interrupt, then a line saying so.
"""

from __future__ import annotations

import sys

import typer

from circuitstat.pipelines.errors import user_error_message

from .app import (EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, Terminated, _one_line, _usage_message, app,
                  echo, study_app, terminal_text)

__all__ = ["app", "echo", "main", "study_app", "terminal_text", "user_error_message"]

# the commands register themselves on `app` / `study_app` when their modules are imported; each
# imports what it runs inside its body, so `circuitstat --help`, `check` and `query` never load torch
from . import analyse, checks, studies  # noqa: E402,F401
from . import export, published, tokens, zoo  # noqa: E402,F401
from . import service  # noqa: E402,F401
from . import compare  # noqa: E402,F401
from . import sample_size  # noqa: E402,F401


def main() -> None:
    """Entry point: run the app; exits with the documented codes (see the module docstring)."""
    from circuitstat.circuits.allocator import reuse_freed_memory

    reuse_freed_memory()  # a command computes and exits: freed tensor memory is reused, not page-faulted again
    _terminate_like_interrupt()
    _old_names_as_one_line()
    command = typer.main.get_command(app)
    try:
        code = command.main(prog_name="circuitstat", standalone_mode=False)
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.TyperException as exc:  # before any command runs: an unknown command or top-level option
        typer.echo(f"error: {_one_line(_usage_message(exc))}", err=True)
        code = EXIT_INPUT
    except Terminated:
        typer.echo("error: terminated (SIGTERM); rerun the same command to resume", err=True)
        code = EXIT_TERMINATED
    except (KeyboardInterrupt, typer.Abort):
        typer.echo("error: interrupted; rerun the same command to resume", err=True)
        code = EXIT_INTERRUPTED
    sys.exit(code if isinstance(code, int) else EXIT_OK)


def _old_names_as_one_line() -> None:
    """Print every Python warning as one ``warning:`` line (a renamed option's names the user's option and its new
    name), once per message, not as Python's ``file:line: category`` with a line of circuitstat's source, and not
    again when another call site raises the same message."""
    import warnings

    seen: set[tuple[type, str]] = set()

    def show(message, category, filename, lineno, file=None, line=None):
        text = _one_line(str(message))
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
