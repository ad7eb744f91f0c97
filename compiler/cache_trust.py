"""Which cache folders flowc trusts, and where it builds when it may not use one.

flowc loads native code from its caches (``kernel.so``, the core library, the precompiled prelude), so
whoever can write a cache folder can run code in every process that uses it.  The rule, the one ssh
and pip apply to their own files:

* a folder or file is **trusted** when it is owned by the current user or by root, and neither its
  group nor other users may write it (no ``g+w``, no ``o+w``; a sticky ``1777`` folder is refused);
* a trusted folder is **writable** by flowc only when the current user owns it.  A cache owned by
  root and not writable by others is a read-only, pre-filled cache: its entries are used, and what
  it lacks is built into a private folder (see ``private_fallback_folder``).

A cache root that is not trusted is never read: flowc warns once (`CacheTrustWarning`, naming the
folder, its owner and mode, and the fix) and uses a private temporary cache for the rest of the
process instead -- caching is off for that run, never silently shared.

Example::

    >>> why_untrusted(os.stat("/tmp"))       # doctest: +SKIP
    'writable by others (mode 0o1777)'
"""
from __future__ import annotations

import atexit
import os
import pwd
import shutil
import stat
import tempfile
from pathlib import Path

__all__ = ["CacheTrustWarning", "ROOT_UID", "current_uid", "is_writable", "make_private_folder",
           "private_fallback_folder", "remove_private_folders", "why_untrusted"]

# The superuser owns system-wide, pre-filled caches; a module variable so tests can pretend otherwise.
ROOT_UID = 0


class CacheTrustWarning(UserWarning):
    """A cache folder or entry was refused because another user could have written it."""


def current_uid() -> int:
    """The user flowc runs as (the effective uid: the one that owns what flowc creates)."""
    return os.geteuid()


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def why_untrusted(st: os.stat_result) -> str | None:
    """Why a folder or file with status `st` cannot be trusted, or None when it can.

    Example::

        >>> why_untrusted(os.stat(Path.home()))   # doctest: +SKIP
    """
    reasons = []
    if st.st_uid not in (current_uid(), ROOT_UID):
        reasons.append(f"owned by {_user(st.st_uid)}, not by you ({_user(current_uid())}) or root")
    writers = [who for who, bit in (("its group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit]
    if writers:
        reasons.append(f"writable by {' and '.join(writers)} (mode {oct(stat.S_IMODE(st.st_mode))})")
    return " and ".join(reasons) or None


def is_writable(st: os.stat_result) -> bool:
    """May flowc write into a trusted folder with status `st`?  Only into its own."""
    return st.st_uid == current_uid()


def make_private_folder(path: Path) -> None:
    """Create `path` with mode 0700 (missing parents with the usual mode); an existing folder is left as it is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)       # the umask can only take bits away from 0700
    except FileExistsError:
        pass


_private_folders: list[tuple[Path, int]] = []     # (folder, the pid that made it): removed at its exit


def private_fallback_folder(purpose: str) -> Path:
    """A new folder only this user can read, removed when this process exits (not when a forked child does)."""
    folder = Path(tempfile.mkdtemp(prefix=f"flowc-private-{purpose}-"))
    if not _private_folders:
        atexit.register(remove_private_folders)
    _private_folders.append((folder, os.getpid()))
    return folder


def remove_private_folders() -> None:
    """Remove the folders `private_fallback_folder` made in this process: at its exit, or before a
    worker of several ranks ends without running the script's exit handlers."""
    while _private_folders:
        folder, creator = _private_folders.pop()
        if os.getpid() == creator:
            shutil.rmtree(folder, ignore_errors=True)
