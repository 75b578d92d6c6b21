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

import enum
import json
import re
import sys
import traceback
import typing
from pathlib import Path

import typer
from typer.core import TyperGroup

from circuitstat.pipelines.options import ABLATION, LEVEL, METHOD, METRIC

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 3, 130, 143


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
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}
DType = enum.Enum("DType", {k: k for k in DTYPES}, type=str)


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


# C0 controls but tab and newline, DEL, C1 controls and the bidirectional overrides/isolates: text from
# files (claim names, table cells, spec values) must not move the cursor, ring the bell, retitle the
# terminal or reorder what is shown (the "Trojan Source" characters).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def terminal_text(text: object) -> str:
    """``text`` as a string with every control character removed (tab and newline kept)."""
    return _CONTROL.sub("", str(text))


def echo(message: object = "", **kw) -> None:
    """typer.echo of ``message`` with control characters removed: every line the CLI prints goes here."""
    typer.echo(terminal_text(message), **kw)


def _one_line(text: str) -> str:
    return " ".join(terminal_text(text).split())


class _Boundary(TyperGroup):
    """The CLI's one error boundary: every command runs inside it, whether started by ``main()``
    or by a test's CliRunner, and leaves with one of the documented exit codes."""

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except (typer.Exit, SystemExit):
            raise
        except typer.TyperException as exc:  # a bad option value (typer's usage errors): one line
            _die(_usage_message(exc), EXIT_INPUT)
        except Terminated:
            _die("terminated (SIGTERM); rerun the same command to resume", EXIT_TERMINATED)
        except (KeyboardInterrupt, typer.Abort):
            _die("interrupted; rerun the same command to resume", EXIT_INTERRUPTED)
        except Exception as exc:  # noqa: BLE001 - this is the boundary
            message = user_error_message(exc)
            if message is not None:
                _die(message, EXIT_INPUT)
            traceback.print_exc(file=sys.stderr)
            _die(f"internal error (a bug in circuitstat, not in your input): {type(exc).__name__}: {exc}; "
                 "please report it with the traceback above", EXIT_INTERNAL)


def _usage_message(exc: Exception) -> str:
    """One line for a usage error: click's message and where to read the command's help."""
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    ctx = getattr(exc, "ctx", None)
    return f"{message} (see `{ctx.command_path} --help`)" if ctx is not None else message


def _die(message: str, code: int) -> typing.NoReturn:
    typer.echo(f"error: {_one_line(message)}", err=True)
    raise typer.Exit(code)


app = typer.Typer(cls=_Boundary, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Statistical circuit discovery and stability audits of transformer language models. "
                       "Exit codes: 0 ok, 1 a check or claim failed, 2 bad input (one-line error), "
                       "3 internal error (a bug), 130 interrupted.")


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


def check_out(out: Path, kind: str | None = None, *, force: bool = False) -> None:
    """InputError when ``out`` exists and is not a directory, or (with ``kind``, the command's name) when
    it holds a run of another command and ``force`` is not given: resuming into it would merge both
    commands' stages into one manifest and replace its spec. Checked before anything is loaded."""
    from circuitstat.core.errors import InputError

    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a directory; give a new or existing run directory")
    if kind is None or force or not (out / "manifest.json").is_file():
        return
    from circuitstat.core.rundir import RunDir

    other = run_kind(RunDir.read_manifest(out).get("spec"))
    if other != kind:
        what = f"a `circuitstat {other}` run" if other else "a run of another command"
        raise InputError(f"--out {out} holds {what}, not a `circuitstat {kind}` run; give a new --out, or pass "
                         "--force to add this run's stages to it (its spec is then replaced)")


# Keys only one command's spec has (the spec each command records in its manifest), most specific first.
RUN_KINDS = (("study heads", ("study", "plan")), ("study calibration", ("sizes", "n_datasets")),
             ("study variance", ("estimators", "counterfactual")), ("audit", ("methods", "bootstrap")),
             ("attribute", ("method", "level", "ablation", "max_rows")), ("tokens", ("measures", "ks")),
             ("heads", ("match", "pairs", "null")))


def run_kind(spec) -> str | None:
    """The command whose run recorded ``spec`` (a manifest's spec), or None when none matches."""
    if not isinstance(spec, dict):
        return None
    return next((kind for kind, keys in RUN_KINDS if all(k in spec for k in keys)), None)














study_app = typer.Typer(cls=_Boundary, no_args_is_help=True, help="Studies: where uncertainty comes from, head stability.")
app.add_typer(study_app, name="study")


# the commands register themselves on `app` / `study_app` when their modules are imported; each
# imports what it runs inside its body, so `circuitstat --help`, `check` and `query` never load torch
from . import analyse, checks, studies  # noqa: E402,F401
from . import tokens, zoo  # noqa: E402,F401
from . import service  # noqa: E402,F401


def main() -> None:
    """Entry point: run the app; exits with the documented codes (see the module docstring)."""
    from circuitstat.circuits.allocator import reuse_freed_memory

    reuse_freed_memory()  # a command computes and exits: freed tensor memory is reused, not page-faulted again
    _terminate_like_interrupt()
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
