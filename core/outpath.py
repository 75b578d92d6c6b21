"""The one output-path policy: where a command may write a file the user named (``--html``, ``--json``, ``--junit``,
``report --out``) and what it never replaces.

A command writes a file atomically (circuitstat.core.atomic: a temporary file renamed over the target), so a
target that is not a regular file would be *replaced*, not written to: ``--html /dev/full`` run as root would
put a web page where the device node was, and a FIFO or another run's ``manifest.json`` would go the same way.
So, before any work:

* the target is a regular file or a new name; a device, FIFO, socket, directory or symbolic link is refused
  (a link is never replaced nor written through: name the file it points to);
* its directory exists (it is not created; ``report --out NEW_DIR`` makes one new directory, as documented);
* it is not a run's own record: ``manifest.json``, ``.lock`` or a ``*.parquet`` table of a run directory;
* below a directory the command fills (``export mib --out D``), no existing component is a symbolic link
  (:func:`check_no_links`): a link planted in D does not lead the write elsewhere.

Run directories (``--out`` of attribute, audit, the studies, sample-size) follow the same rule through
circuitstat.pipelines.kinds.check_run_out: ``--force`` only ever resumes or replaces a run of the same kind.
Refusals are InputError (exit 2) naming the path, what it is and the fix. :func:`replaceable` is the last
guard inside atomic_write itself.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from circuitstat.core.errors import InputError

__all__ = ["check_output_file", "check_no_links", "replaceable", "what_is", "RUN_RECORDS"]

RUN_RECORDS = ("manifest.json", ".lock")
"""Files of a run directory that no output option may name (its tables, ``*.parquet``, neither)."""


def what_is(mode: int) -> str:
    """The kind of a non-regular file (an ``st_mode``), in words: "a directory", "a FIFO", "a device", ..."""
    for test, words in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a device"),
                        (stat.S_ISBLK, "a device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


def replaceable(path: str | os.PathLike[str]) -> None:
    """InputError when ``path`` exists and is not a regular file or a symbolic link (a device, FIFO, socket or
    directory): an atomic write would replace that node with a file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise InputError(f"{path} is {what_is(mode)}, not a regular file; it is never replaced by a write: give a new "
                         "file name")


def check_output_file(path: str | os.PathLike[str], *, flag: str, new_dir: bool = False) -> Path:
    """Return ``path`` (the file option ``flag`` names) when the policy (module doc) lets a command write it; InputError
    naming the problem and the fix otherwise. ``new_dir``: its directory may be one new directory in an existing one."""
    p = Path(path)
    try:
        mode = os.lstat(p).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        fix = "the file it points to" if stat.S_ISLNK(mode) else "a new file name"
        raise InputError(f"{flag} {p} is {what_is(mode)}, not a regular file; it is never replaced or written through: "
                         f"give {fix}")
    parent = p.parent
    if not parent.is_dir():
        if not (new_dir and not os.path.lexists(parent) and parent.parent.is_dir()):
            what = "is not a directory" if os.path.lexists(parent) else "does not exist"
            raise InputError(f"{flag} {p}: directory {parent} {what}; create it first or give a file in an existing "
                             "directory")
    elif (parent / RUN_RECORDS[0]).is_file() and (p.name in RUN_RECORDS or p.suffix == ".parquet"):
        raise InputError(f"{flag} {p} is a run's own record (its manifest, lock or a table) in run directory {parent}; "
                         "give a file name outside the run's records")
    return p


def check_no_links(root: str | os.PathLike[str], path: str | os.PathLike[str], *, flag: str) -> None:
    """InputError when an existing component of ``path`` below ``root`` (the directory the user named with ``flag``)
    is a symbolic link or not a directory/regular file: a write below ``root`` never leaves it through a link."""
    root, p = Path(root), Path(path)
    at = root
    for name in p.relative_to(root).parts:
        at = at / name
        try:
            mode = os.lstat(at).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISLNK(mode):
            raise InputError(f"{flag} {root}: {at} is a symbolic link; nothing is written through a link inside the "
                             "output directory: remove it or give a new directory")
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            raise InputError(f"{flag} {root}: {at} is {what_is(mode)}; give a new directory")
