"""An exclusive lock file (O_CREAT|O_EXCL) holding pid and host, with takeover of stale locks."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from circuitstat.core.provenance import utc_now

# A lock file that cannot be parsed is normally one being written right now (create, then write):
# only after this many seconds is it treated as left by a writer killed in between.
UNREADABLE_GRACE_S = 2.0


class RunLockedError(RuntimeError):
    """Another live process holds the lock of this run directory."""


class StaleLockWarning(UserWarning):
    """A lock left by a dead process was taken over."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OverflowError:
        return False
    return True


class DirLock:
    """Exclusive lock at `path`; use as a context manager or with acquire()/release()."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._token: str | None = None
        self._owner_pid: int | None = None

    @property
    def held(self) -> bool:
        """Return True while this object holds the lock (in this process)."""
        return self._token is not None and self._owner_pid == os.getpid()

    def _read(self) -> tuple[bytes | None, dict[str, Any] | None]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None, None
        try:
            info = json.loads(raw)
            return raw, info if isinstance(info, dict) and "pid" in info else None
        except ValueError:
            return raw, None

    def _try_create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        token = uuid.uuid4().hex
        info = {"pid": os.getpid(), "host": socket.gethostname(), "created_utc": utc_now(), "token": token}
        try:
            os.write(fd, json.dumps(info).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self._token, self._owner_pid = token, os.getpid()
        return True

    def _stale_reason(self, raw: bytes, info: dict[str, Any] | None) -> str | None:
        if info is None:
            try:
                age = time.time() - self.path.stat().st_mtime
            except FileNotFoundError:
                return None
            return f"unreadable lock file {age:.0f}s old" if age > UNREADABLE_GRACE_S else None
        if info.get("host") == socket.gethostname() and not _pid_alive(int(info["pid"])):
            return f"process {info['pid']} on {info['host']} is no longer running"
        return None

    def _take_over(self, raw: bytes, reason: str) -> None:
        # Rename (atomic) rather than unlink, then check we moved the file we judged stale: if a
        # racing process replaced it meanwhile, we moved a live lock and must put it back.
        moved = self.path.with_name(f"{self.path.name}.stale.{uuid.uuid4().hex[:8]}")
        try:
            os.rename(self.path, moved)
        except FileNotFoundError:
            return
        try:
            if moved.read_bytes() == raw:
                warnings.warn(f"taking over stale lock {self.path} ({reason})", StaleLockWarning, stacklevel=4)
            else:
                with contextlib.suppress(FileExistsError):
                    os.link(moved, self.path)  # link never overwrites an existing lock
        finally:
            with contextlib.suppress(FileNotFoundError):
                moved.unlink()

    def acquire(self) -> None:
        """Take the lock, or raise RunLockedError naming the holder and the fix."""
        if self.held:
            raise RuntimeError(f"{self.path} is already held by this object")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + UNREADABLE_GRACE_S + 1.0
        while True:
            if self._try_create():
                return
            raw, info = self._read()
            if raw is None:
                continue  # released between our create and read: try again
            reason = self._stale_reason(raw, info)
            if reason is not None:
                self._take_over(raw, reason)
                continue
            if info is None and time.monotonic() < deadline:
                time.sleep(0.05)  # being written right now
                continue
            holder = f"process {info['pid']} on host {info['host']} (since {info.get('created_utc')})" if info else "an unknown process"
            raise RunLockedError(
                f"{self.path.parent} is locked by {holder}. Wait for that run to finish, or write to "
                f"another directory; if no run is using it (e.g. it ran on another machine and died), "
                f"delete {self.path}"
            )

    def release(self) -> None:
        """Release the lock if this object (in this process) holds it."""
        if not self.held:
            return
        _, info = self._read()
        if info is not None and info.get("token") == self._token:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self._token = self._owner_pid = None

    def __enter__(self) -> DirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
