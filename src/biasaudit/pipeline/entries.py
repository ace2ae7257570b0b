"""What is wrong with an entry of a user's input folder, in words: a broken link, a link loop, a
directory where a file belongs, a file that cannot be read. The scans of input folders (source
photos, an imported FOCUS set, a folder generator's images, `check`) name these instead of calling
them "not a photo format" or passing them over. Standard library only."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

BROKEN_LINK = "broken link"
LINK_LOOP = "link loop"
DIRECTORY = "a directory, not a file"
LEAVES = "leaves the folder"


def _link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def outside(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """Whether `path`, its links followed, lies outside the folder `root` (its links followed too)."""
    try:
        return not Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))
    except (OSError, ValueError):
        return True


def entry_problem(path: str | os.PathLike, root: str | os.PathLike | None = None) -> str:
    """Why `path` is not a readable regular file ('' when it is one, directly or through links). With the
    input folder `root`, a link whose target lies outside it is a problem too: it is not followed, so a photo
    folder cannot make a stage read (or hash) /etc/hostname."""
    path = Path(path)
    if root is not None and os.path.exists(path) and outside(path, root):  # (a broken link or a loop: below)
        if path.is_symlink():
            return f"{LEAVES}: link '{path.name}' → '{_link_target(path)}', outside {Path(root).as_posix()}; not followed"
        return f"{LEAVES}: '{path}' lies outside {Path(root).as_posix()}; not read"
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{LINK_LOOP}: '{path.name}' → '{_link_target(path)}' leads back to itself"
        if path.is_symlink():
            return f"{BROKEN_LINK}: '{path.name}' → '{_link_target(path)}', which does not exist"
        return f"cannot be read: {exc.strerror or exc}"
    if stat.S_ISDIR(st.st_mode):
        return DIRECTORY
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a pipe, socket or device)"
    if not os.access(path, os.R_OK):
        return "not readable: permission denied"
    return ""


def folder_problems(root: str | os.PathLike) -> list[str]:
    """Every entry under the folder `root` that cannot be read as a file or a folder, as
    '<relative path>: <why>' (the folder itself missing or unreadable: one line saying so)."""
    root = Path(root)
    if not root.exists():
        return [f"{root}: does not exist" + (" (a broken link)" if root.is_symlink() else "")]
    if not root.is_dir():
        return [f"{root}: not a folder"]
    problems: list[str] = []

    def unlistable(exc: OSError) -> None:
        where = Path(exc.filename).relative_to(root).as_posix()
        problems.append(f"{root if where == '.' else where}: cannot be listed: {exc.strerror}")

    for folder, dirs, files in os.walk(root, onerror=unlistable):
        for name in sorted(files + [d for d in dirs if Path(folder, d).is_symlink()]):
            path = Path(folder, name)
            why = entry_problem(path, root)
            if why and why != DIRECTORY:
                problems.append(f"{path.relative_to(root).as_posix()}: {why}")
    return problems
