"""The fenced code blocks of a Markdown page: what the README and docs tests read."""

from __future__ import annotations

from pathlib import Path


def blocks(path: Path, langs: tuple[str, ...]) -> list[str]:
    """The fenced code blocks of ``path`` whose fence names one of ``langs`` ("" for unlabelled), in order."""
    out, current = [], None
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            if current is None:
                current = [] if line[3:].strip() in langs else False  # False: inside another kind of block
            else:
                if current is not False:
                    out.append("\n".join(current) + "\n")
                current = None
        elif isinstance(current, list):
            current.append(line)
    assert current is None, f"{path.name}: a code block is not closed"
    return out
