"""The ``circuitstat`` app and what its command modules share: choices, help texts, the error boundary, echo."""


from __future__ import annotations

import enum
import re
import sys
import traceback
import typing
from pathlib import Path

import typer
from typer.core import TyperGroup

from circuitstat.pipelines.options import ABLATION, DTYPES, LEVEL, METHOD, METRIC

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 3, 130, 143
EXIT_PIPE = 141  # the reader of our output closed it (`circuitstat --help | head`): 128 + SIGPIPE, as other tools


def reader_gone() -> typing.NoReturn:
    """Exit EXIT_PIPE without a word: the reader of stdout closed it, which is no error of the user's or ours;
    stdout is pointed at /dev/null first, so Python's flush at exit cannot raise again (Python's docs, "Note on
    SIGPIPE")."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (a test's captured stdout): nothing to flush into a pipe
        pass
    raise typer.Exit(EXIT_PIPE)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread: every ``finally`` and RunDir exit runs as for Ctrl-C."""


def choices(name: str, *values: str) -> type[enum.Enum]:
    """A str Enum of ``values`` for a typer option, so ``--help`` lists them and typer refuses others."""
    return enum.Enum(name, {v: v for v in values}, type=str)


def _choices(name: str, literal) -> type[enum.Enum]:
    """The str Enum of a spec Literal's values (one list: the spec's)."""
    return choices(name, *typing.get_args(literal))


Method = _choices("Method", METHOD)
Level = _choices("Level", LEVEL)
Ablation = _choices("Ablation", ABLATION)
MetricName = _choices("MetricName", METRIC)
DType = enum.Enum("DType", {k: k for k in DTYPES}, type=str)



from circuitstat.pipelines.errors import user_error_message
from circuitstat.reports.visible import visible

# C0 controls but tab and newline, DEL, C1 controls and the bidirectional overrides/isolates: text from
# files (claim names, table cells, spec values) must not move the cursor, ring the bell, retitle the
# terminal or reorder what is shown (the "Trojan Source" characters): each is shown as its escape.


def terminal_text(text: object) -> str:
    """``text`` as a string with every control and bidi character shown as its escape (tab and newline kept)."""
    return visible(text)


def echo(message: object = "", **kw) -> None:
    """typer.echo of ``message`` with control characters made visible: every line the CLI prints goes here."""
    typer.echo(terminal_text(message), **kw)


QUOTE_MAX = 400
"""Characters of a quoted value (or an unbroken token, such as a path) an error line shows in full;
longer ones show their two ends."""
LINE_MAX = 4000
"""Characters of an error line at most (a message quoting many long values)."""
# a quoted value opens at a quote no letter precedes and closes at one no letter follows: the text between two short
# quoted words ("needs a 'kind'; kinds: ...; give a bound: 'min'") or two apostrophes is not one value
_LONG = re.compile(r"""(?<!\w)'[^'\n]{%d,}'(?!\w)|(?<!\w)"[^"\n]{%d,}"(?!\w)|\S{%d,}"""
                   % (QUOTE_MAX + 3, QUOTE_MAX + 3, QUOTE_MAX + 3))


def shorten_values(text: str) -> str:
    """``text`` with every quoted value or unbroken token longer than :data:`QUOTE_MAX` cut to its two
    ends and its length (a 100 KB template in an option is named, not printed), and at most
    :data:`LINE_MAX` characters in all."""
    def cut(m: re.Match) -> str:
        s = m.group(0)
        q = s[0] if len(s) > 1 and s[0] in "'\"" and s[-1] == s[0] else ""
        body = s[1:-1] if q else s
        half = QUOTE_MAX // 2
        return f"{q}{body[:half]}…{body[-half:]}{q} ({len(body):,} characters)"

    out = _LONG.sub(cut, text)
    return out if len(out) <= LINE_MAX else f"{out[:LINE_MAX]}… ({len(out):,} characters)"


def one_line(text: str) -> str:
    """``text`` as one line for the terminal: control characters escaped, white space collapsed, long values shortened."""
    return shorten_values(" ".join(terminal_text(text).split()))


class BoundaryGroup(TyperGroup):
    """The CLI's one error boundary: every command runs inside it, whether started by ``main()``
    or by a test's CliRunner, and leaves with one of the documented exit codes."""

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except (typer.Exit, SystemExit):
            raise
        except typer.TyperException as exc:  # a bad option value (typer's usage errors): one line
            _die(usage_message(exc), EXIT_INPUT)
        except Terminated:
            _die("terminated (SIGTERM); rerun the same command to resume", EXIT_TERMINATED)
        except (KeyboardInterrupt, typer.Abort):
            _die("interrupted; rerun the same command to resume", EXIT_INTERRUPTED)
        except BrokenPipeError:  # the reader of our output went away (`| head`): not a path, permission or disk
            reader_gone()
        except Exception as exc:  # noqa: BLE001 - this is the boundary
            message = user_error_message(exc)
            if message is not None:
                _die(message, EXIT_INPUT)
            traceback.print_exc(file=sys.stderr)
            _die(f"internal error (a bug in circuitstat, not in your input): {type(exc).__name__}: {exc}; "
                 "please report it with the traceback above", EXIT_INTERNAL)


def usage_message(exc: Exception) -> str:
    """One line for a usage error: click's message and where to read the command's help."""
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    ctx = getattr(exc, "ctx", None)
    return f"{message} (see `{ctx.command_path} --help`)" if ctx is not None else message


def _die(message: str, code: int) -> typing.NoReturn:
    typer.echo(f"error: {one_line(message)}", err=True)
    raise typer.Exit(code)


app = typer.Typer(cls=BoundaryGroup, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Statistical circuit discovery and stability audits of transformer language models. "
                       "Exit codes: 0 ok, 1 a check or claim failed, 2 bad input (one-line error), "
                       "3 internal error (a bug), 130 interrupted, 141 the reader of the output closed it.")


@app.callback()
def _root() -> None:
    """Statistical circuit discovery and stability audits of transformer language models."""


def fail(message: str, code: int = EXIT_INPUT) -> None:
    """Print a one-line error and exit with ``code``."""
    _die(message, code)


TASK_HELP = ("induction, ioi, greater-than, or a task file (.jsonl/.csv/.parquet, one example per row: clean, "
             "corrupted, answer, wrong_answer[, group]; docs/usage.md)")
# circuitstat.pipelines.build.TASK_OPTION_HELP, written out so that --help does not import torch
TASK_OPTION_HELP = ("KEY=VALUE option of the task's builder, repeatable (e.g. seq_len=10, corrupt=answer, "
                    "prepend_bos=false, templates=[...]); values are YAML and checked against the builder's types")
ALLOW_PICKLE_HELP = "allow pickled weights (.bin/.pt): loading them can run code; only for sources you trust"
ALLOW_LARGE_HELP = "lift the limits on memory and work (sizes from files are refused above them)"


TRUST_UNRECORDED_HELP = ("read tables the run's manifest has no record of (tables you made yourself), unchecked; "
                         "they are named in the output. Without it such a table, or an unreadable manifest, is "
                         "refused (exit 2)")


def trust_option() -> typer.models.OptionInfo:
    """The ``--trust-unrecorded`` option of every command that reads a run (circuitstat.core.run_check)."""
    return typer.Option(False, "--trust-unrecorded", help=TRUST_UNRECORDED_HELP)


def verified(run: Path, trust_unrecorded: bool = False, label: str | None = None) -> None:
    """Check run directory ``run`` with the one verified reader before it is read (exit 2 when its tables are not
    the ones it recorded); name on stderr the tables read unchecked under ``--trust-unrecorded``."""
    from circuitstat.core.run_check import verify_outputs

    note = verify_outputs(run, trust_unrecorded=trust_unrecorded).note(label or str(run))
    if note is not None:
        echo(f"warning: {note}", err=True)


def check_out(out: Path, kind: str | None = None, *, force: bool = False) -> None:
    """InputError when ``out`` cannot take a run of ``kind`` (circuitstat.pipelines.kinds.check_run_out)."""
    from circuitstat.pipelines.kinds import check_run_out

    check_run_out(out, kind, force=force)


study_app = typer.Typer(cls=BoundaryGroup, no_args_is_help=True, help="Studies: where uncertainty comes from, head stability.")
app.add_typer(study_app, name="study")
