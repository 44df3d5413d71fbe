"""Hashing and atomic writes shared by every stage.

A stage's output is either complete or absent: each file is written to a
temporary name in the same directory, flushed to disk, then renamed over the
target (rename within one filesystem is atomic on POSIX).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline_runtime.files import sha256_file

log = logging.getLogger(__name__)
# Every staging folder's name carries its maker, "~<pid>.<pid namespace>@<host>~", so one
# left behind by a process that was killed (SIGKILL, a timeout) can be told from one in use.
# The namespace: two containers sharing a folder and a hostname (host networking) number
# their processes apart, and one's live pid is nothing in the other's.
_OWNER = re.compile(r"~(\d+)\.(\d+)@([^~/]+)~")


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # no /proc: nothing is swept, as for another host's folders
        return 0


def _owner() -> str:
    return f"~{os.getpid()}.{_pid_namespace()}@{socket.gethostname()}~"


__all__ = [
    "atomic_path",
    "atomic_write",
    "readable_tree",
    "sha256_file",
    "staging_dir",
    "sweep_abandoned",
    "write_json",
    "write_secret",
]


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def staging_dir(prefix: str, parent: Path) -> Path:
    """A new, empty folder in `parent` for a stage's output, renamed into place when done,
    with an ordinary mkdir's mode (umask applied): mkdtemp's 0700 stayed on the export,
    the version or the deployment it became, and a container's unprivileged user (the
    deploy's Dockerfile runs as uid 1000) could not read what COPY put in the image."""
    folder = Path(tempfile.mkdtemp(prefix=f"{prefix}{_owner()}", dir=parent))
    folder.chmod(0o777 & ~_umask())
    return folder


def sweep_abandoned(parent: Path) -> list[Path]:
    """Remove the hidden staging folders in `parent` (`staging_dir`'s) whose maker, a process
    on this host, is gone: what an export, publish or deploy stopped mid-way left behind
    (cleanup runs on an error or Ctrl-C, not on SIGKILL or a default SIGTERM). Folders
    of live processes and of other hosts or pid namespaces (a shared disk) are kept."""
    host, space, removed = socket.gethostname(), _pid_namespace(), []
    try:
        entries = [p for p in Path(parent).iterdir() if p.name.startswith(".")]
    except OSError:
        return []
    for path in entries:
        owner = _OWNER.search(path.name)
        if owner is None or (owner[3], int(owner[2])) != (host, space) or not space:
            continue
        if _alive(int(owner[1])):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed %s, left by process %s, which was stopped mid-way", path, owner[1])
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process; a pid past any
        return True
    return True


def readable_tree(root: Path) -> None:
    """Let everyone read (and enter) what is under `root`, as a container image that runs
    as another user needs: folders gain r-x, files r--, for group and others (an export
    made before `staging_dir` is 0700)."""
    for folder, _, files in os.walk(root):
        Path(folder).chmod(Path(folder).stat().st_mode | 0o755)
        for name in files:
            path = Path(folder) / name
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o644)


@contextmanager
def atomic_path(target: Path, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `target`; rename it over `target` on success.

    On any exception the temporary file is removed and `target` is untouched.
    `mode`: the file's permissions (default: an ordinary write's, the umask applied).
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    # mkstemp creates 0600 (O_EXCL: never through a file or link someone left there); give
    # the result the mode asked for, or the one an ordinary write would (umask applied).
    if mode is None:
        mode = 0o666 & ~_umask()
    tmp.chmod(mode)
    try:
        yield tmp
        with tmp.open("rb") as fh:
            os.fsync(fh.fileno())
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(target: Path, writer: Callable[[Path], None], mode: int | None = None) -> Path:
    """Call `writer(tmp_path)` and atomically move the result to `target`."""
    with atomic_path(target, mode) as tmp:
        writer(tmp)
    return Path(target)


def write_json(target: Path, data: Any) -> Path:
    """Write `data` as indented, key-sorted JSON, atomically."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    return atomic_write(target, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_secret(target: Path, data: Any) -> Path:
    """Write `data` as JSON readable by the owner only (0600 from creation to rename):
    token files."""
    text = json.dumps(data, indent=2) + "\n"
    return atomic_write(target, lambda tmp: tmp.write_text(text, encoding="utf-8"), mode=0o600)
