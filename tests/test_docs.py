"""Docs that cannot drift: every file in docs/ and the README is checked against the code.

* every ``circuitstat ...`` command line in a code block is parsed by the real CLI (every option,
  argument and choice; nothing runs) — the README's Python example also runs (tests/test_readme.py);
* every Python block compiles, its ``circuitstat`` imports exist, and each call of an imported name
  (``f(...)``, ``Cls.method(...)``) binds to that callable's signature;
* every YAML block parses, and the audit specs and claims files among them validate;
* a sentence that lists the supported model families names all of them (the converter's registry);
* no deprecated name (a hidden CLI flag, a renamed parameter, spec key or keyword) appears anywhere.

The checks run on every ``docs/*.md`` (a new page is covered without being listed) and each check
is shown to catch a planted stale page.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shlex
from pathlib import Path

import pytest
from doc_blocks import blocks

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("", "bash", "sh", "shell", "console")


def command_lines(path: Path) -> list[list[str]]:
    """argv (after ``circuitstat``) of each command line of the page's shell blocks, comments stripped."""
    lines = []
    for block in blocks(path, SHELL):
        for line in block.splitlines():
            line = line.split("  #")[0].strip().removeprefix("$ ")
            if line.startswith("- run: "):
                line = line[len("- run: "):]
            for prefix in ("circuitstat ", "python -m circuitstat "):
                if line.startswith(prefix):
                    lines.append(shlex.split(line[len(prefix):]))
    return lines


def parse_command(argv: list[str]) -> None:
    """Parse ``circuitstat ARGV`` with the real CLI (click.UsageError on an unknown option or bad value)."""
    import typer

    from circuitstat.pipelines.cli import app

    cmd, args, name = typer.main.get_command(app), [a for a in argv if a != "..."], "circuitstat"
    while args and hasattr(cmd, "commands") and args[0] in cmd.commands:
        name, cmd = args[0], cmd.commands[args.pop(0)]
    assert not hasattr(cmd, "commands"), f"command {argv} names no subcommand"
    cmd.make_context(name, args)


def _resolve(module: str, name: str):
    obj = importlib.import_module(module)
    return getattr(obj, name)


def python_problems(code: str, where: str) -> list[str]:
    """What in a Python block does not match the API: missing imports, keywords or arity a signature refuses."""
    tree = ast.parse(code, where)
    names, problems = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "circuitstat":
            for alias in node.names:
                try:
                    names[alias.asname or alias.name] = _resolve(node.module, alias.name)
                except (ImportError, AttributeError) as exc:
                    problems.append(f"{where}:{node.lineno} from {node.module} import {alias.name}: {exc}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func, label = None, None
        if isinstance(node.func, ast.Name) and node.func.id in names:
            func, label = names[node.func.id], node.func.id
        elif (isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
              and node.func.value.id in names and inspect.isclass(names[node.func.value.id])):
            owner = names[node.func.value.id]
            func, label = getattr(owner, node.func.attr, None), f"{node.func.value.id}.{node.func.attr}"
            if func is None:
                problems.append(f"{where}:{node.lineno} {label} does not exist")
                continue
        if func is None or not callable(func):
            continue
        try:
            sig = inspect.signature(func)
        except (TypeError, ValueError):
            continue
        has_var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        args = [None] * sum(not isinstance(a, ast.Starred) for a in node.args)
        kwargs = {k.arg: None for k in node.keywords if k.arg is not None}
        if has_var_kw:  # keywords swallowed by **kw are checked for old names only (below)
            kwargs = {k: v for k, v in kwargs.items() if k in sig.parameters}
        try:
            sig.bind_partial(*args, **kwargs)
        except TypeError as exc:
            problems.append(f"{where}:{node.lineno} {label}(...): {exc}")
    return problems


def deprecated_names() -> dict[str, str]:
    """Every old name still read with a warning -> its new name: hidden CLI flags, renamed parameters,
    spec keys and keywords."""
    import typer

    from circuitstat.core.estimator import Estimator
    from circuitstat.core.topk import RENAMED_KEYWORDS
    from circuitstat.pipelines.cli import app
    from circuitstat.pipelines.spec import StrictSpec

    old: dict[str, str] = {}

    def walk(cmd):
        for param in getattr(cmd, "params", []):
            if getattr(param, "hidden", False):
                for flag in [*param.opts, *param.secondary_opts]:
                    old[flag] = f"a hidden option of `{cmd.name}` (its help names the new one)"
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    walk(typer.main.get_command(app))
    for base in (Estimator, StrictSpec):
        _import_every_module()
        todo = [base]
        while todo:
            cls = todo.pop()
            todo += cls.__subclasses__()
            for o, n in getattr(cls, "_renamed", {}).items():
                old[f"{o}="] = n
                old[f"{o}:"] = n
    old.update({f"{o}=": n for o, n in RENAMED_KEYWORDS.items()})
    return old


def _import_every_module() -> None:
    import pkgutil

    import circuitstat

    for info in pkgutil.walk_packages(circuitstat.__path__, "circuitstat."):
        if not info.name.endswith("__main__") and ".migrations" not in info.name:
            importlib.import_module(info.name)


def deprecated_uses(text: str, old: dict[str, str]) -> list[str]:
    """The old names ``text`` uses (a flag as a whole word; a keyword or key followed by = or :)."""
    found = []
    for name in old:
        pattern = (rf"(?<![\w-]){re.escape(name)}(?![\w-])" if name.startswith("--")
                   else rf"(?<![\w.]){re.escape(name)}")
        if re.search(pattern, text):
            found.append(name)
    return sorted(found)


# model_type -> the names a page may call the family by
FAMILY_NAMES = {
    "gpt2": ("gpt2", "GPT-2"), "gpt_neox": ("gpt_neox", "GPT-NeoX", "Pythia"), "llama": ("llama", "Llama"),
    "qwen2": ("qwen2", "Qwen2", "Qwen 2"), "qwen3": ("qwen3", "Qwen3", "Qwen 3"), "mistral": ("mistral", "Mistral"),
    "gemma2": ("gemma2", "Gemma 2", "Gemma-2"), "gemma3_text": ("gemma3_text", "Gemma 3", "Gemma-3"),
    "phi3": ("phi3", "Phi-3"), "olmo2": ("olmo2", "OLMo 2", "OLMo-2"),
    "gemma": ("gemma", "Gemma 1"), "granite": ("granite", "Granite"), "smollm3": ("smollm3", "SmolLM3"),
    "olmo": ("olmo", "OLMo 1"), "starcoder2": ("starcoder2", "StarCoder2"),
    "mixtral": ("mixtral", "Mixtral"), "qwen2_moe": ("qwen2_moe", "Qwen2-MoE"), "qwen3_moe": ("qwen3_moe", "Qwen3-MoE"),
    "olmoe": ("olmoe", "OLMoE"), "gpt_oss": ("gpt_oss", "GPT-OSS", "gpt-oss"),
}
FAMILY_NAMES.update({"phi": ("phi", "Phi-1", "Phi-2"), "gptj": ("gptj", "GPT-J"), "cohere": ("cohere", "Cohere"),
                     "stablelm": ("stablelm", "StableLM"), "falcon": ("falcon", "Falcon")})
LIST_WORDS = re.compile(r"support|ARCH is|famil(y|ies):", re.I)


def stale_family_lists(text: str, supported: tuple[str, ...]) -> list[str]:
    """Sentences that list supported families (a list word and three or more families) but not all of them."""
    bad = []
    for sentence in re.split(r"(?<=[.;])\s+|\n\n", text):
        named = {t for t, aliases in FAMILY_NAMES.items()
                 if any(re.search(rf"(?<![\w-]){re.escape(a)}(?!\w)", sentence) for a in aliases)}
        if len(named) >= 3 and LIST_WORDS.search(sentence) and set(supported) - named:
            bad.append(f"{' '.join(sentence.split())[:120]!r} lacks {sorted(set(supported) - named)}")
    return bad


# --- the checks, on every page ------------------------------------------------------------------
COMMANDS = [(p.name, argv) for p in PAGES for argv in command_lines(p)]


def test_every_page_is_checked_and_pages_hold_commands() -> None:
    assert {p.name for p in PAGES} >= {"README.md", "usage.md", "python-api.md", "families.md", "service.md"}
    assert len(COMMANDS) >= 30  # the extraction still finds the pages' commands


@pytest.mark.parametrize("where, argv", COMMANDS, ids=lambda a: a if isinstance(a, str) else " ".join(a[:2]))
def test_documented_command_parses(where: str, argv: list[str]) -> None:
    parse_command(argv)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_blocks_match_the_api(page: Path) -> None:
    problems = []
    for i, code in enumerate(blocks(page, ("python",))):
        problems += python_problems(code, f"{page.name} block {i + 1}")
    assert problems == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_yaml_blocks_parse_and_specs_validate(page: Path) -> None:
    import yaml

    from circuitstat.pipelines.claims import parse_claims
    from circuitstat.pipelines.spec import parse_spec

    for code in blocks(page, ("yaml",)):
        data = yaml.safe_load(code)
        if isinstance(data, dict) and "claims" in data:
            parse_claims(data, page.name)
        elif isinstance(data, dict) and ("model" in data or "models" in data) and "task" in data:
            parse_spec(data, page.name)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_family_lists_name_every_supported_family(page: Path) -> None:
    from circuitstat.circuits.convert import SUPPORTED

    assert stale_family_lists(page.read_text(), SUPPORTED) == []


def test_no_page_uses_a_deprecated_name() -> None:
    old = deprecated_names()
    assert {"--signed", "--absolute", "absolute=", "n_boot:"} <= set(old)
    found = {p.name: deprecated_uses(p.read_text(), old) for p in PAGES}
    assert {k: v for k, v in found.items() if v} == {}


# --- each check catches a planted stale page ------------------------------------------------------
def test_the_checks_catch_a_stale_page(tmp_path: Path) -> None:
    from circuitstat.circuits.convert import SUPPORTED

    page = tmp_path / "stale.md"
    page.write_text("Supported families: GPT-2, GPT-NeoX/Pythia, Llama-family and Qwen2.\n\n"
                    "```\ncircuitstat circuit runs/a --k 20 --signed\ncircuitstat attribute --model m --methd eap\n```\n\n"
                    "```python\nfrom circuitstat import Circuit, bootstrap_edges\n"
                    "c = Circuit.top_k(S, 20, absolute=True)\nci = bootstrap_edges(S.scores, n_boots=10)\n"
                    "from circuitstat.stats import no_such_name\n```\n")
    text = page.read_text()
    assert len(stale_family_lists(text, SUPPORTED)) == 1
    assert stale_family_lists(text.replace("Qwen2.", ", ".join(SUPPORTED) + "."), SUPPORTED) == []
    old = deprecated_names()
    assert deprecated_uses(text, old) == ["--signed", "absolute="]
    first, second = command_lines(page)
    parse_command(first)  # a hidden (old) flag still parses: the deprecated-name check is what catches it
    with pytest.raises(Exception, match="No such option: --methd"):  # click's UsageError, as typer vendors it
        parse_command(second)
    (code,) = blocks(page, ("python",))
    problems = python_problems(code, "stale.md")
    assert any("no_such_name" in p for p in problems)
    assert any("n_boots" in p for p in problems)
    assert len(problems) == 2
