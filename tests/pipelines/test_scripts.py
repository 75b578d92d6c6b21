"""Run-like entry points that are not run kinds are listed once, in circuitstat.pipelines.kinds.SCRIPTS (issue 46):
every module that runs as ``python -m`` is the command line or a listed script, ``circuitstat scripts`` prints each,
and docs/usage.md lists each and no other ``python -m circuitstat...`` module."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from circuitstat.pipelines.kinds import KINDS, SCRIPTS

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("core", "stats", "circuits", "reports", "pipelines", "circuitstat")  # folder X is circuitstat.X
# the command line itself (`circuitstat`, `python -m circuitstat`, `python -m circuitstat.pipelines.cli`)
COMMAND_LINE = {"circuitstat.__main__", "circuitstat.pipelines.cli", "circuitstat.pipelines.cli.__main__"}
MAIN_GUARD = re.compile(r"^if __name__ == [\"']__main__[\"']", re.M)


def python_m_modules(root: Path, layers=LAYERS) -> set[str]:
    """The dotted names of the package's modules that do something when run as ``python -m`` (a __main__ guard, or a
    __main__.py)."""
    found = set()
    for layer in layers:
        for path in (root / layer).rglob("*.py"):
            rel = path.relative_to(root).with_suffix("").parts
            if "migrations" in rel:
                continue
            dotted = ".".join(("circuitstat",) + (rel[1:] if rel[0] == "circuitstat" else rel))
            if path.name == "__main__.py" or MAIN_GUARD.search(path.read_text()):
                found.add(dotted.removesuffix(".__init__"))
    return found


def usage_problems(text: str) -> list[str]:
    """What docs/usage.md's ``text`` gets wrong about the scripts: one not listed, or a listed module not a script."""
    listed = set(re.findall(r"python -m (circuitstat[\w.]*)", text))
    scripts = {s.module for s in SCRIPTS.values()}
    return ([f"{m} is a script docs/usage.md does not list" for m in sorted(scripts - listed)]
            + [f"docs/usage.md runs {m}, which is not a script" for m in sorted(listed - scripts - COMMAND_LINE)])


def test_every_python_m_module_is_the_command_line_or_a_listed_script():
    assert python_m_modules(ROOT) == COMMAND_LINE | {s.module for s in SCRIPTS.values()}


def test_an_unlisted_python_m_module_is_found(tmp_path):
    """Negative control: a planted module with a __main__ guard is found, so the equality above would fail."""
    (tmp_path / "stats" / "sub").mkdir(parents=True)
    (tmp_path / "stats" / "sub" / "study.py").write_text('def main():\n    pass\n\n\nif __name__ == "__main__":\n'
                                                          "    main()\n")
    (tmp_path / "stats" / "quiet.py").write_text('"""if __name__ == "__main__" in a docstring is no guard."""\n')
    assert python_m_modules(tmp_path, ("stats",)) == {"circuitstat.stats.sub.study"}


def test_scripts_are_not_run_kinds_and_their_modules_run():
    assert SCRIPTS and not set(SCRIPTS) & set(KINDS)
    for s in SCRIPTS.values():
        assert s.name and s.summary and s.writes and (ROOT / s.doc).is_file(), s
        assert s.command == f"python -m {s.module}"


def test_usage_lists_each_script_and_no_other():
    text = (ROOT / "docs" / "usage.md").read_text()
    assert usage_problems(text) == []
    one = next(iter(SCRIPTS.values())).module  # negative controls: a script dropped, a module that is none
    assert usage_problems(text.replace(f"python -m {one}", "python -m x")) == [
        f"{one} is a script docs/usage.md does not list"]
    assert usage_problems(text + "\n`python -m circuitstat.stats.bootstrap`\n") == [
        "docs/usage.md runs circuitstat.stats.bootstrap, which is not a script"]


def test_the_scripts_command_prints_each_script():
    from circuitstat.pipelines.cli import app

    res = CliRunner().invoke(app, ["scripts"])
    assert res.exit_code == 0, res.output
    for s in SCRIPTS.values():
        assert s.command in res.output and s.writes in res.output
