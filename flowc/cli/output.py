"""Files the `flowc` commands write: a missing folder or an unwritable file is one line, not a traceback.

The target is checked before any work (tracing and compiling a job takes seconds), and the write
itself turns an OSError into the same one-line CliError.
"""
from __future__ import annotations

import os
from pathlib import Path

from flowc.cli.modules import CliError


def check_output_file(text: str, option: str) -> Path:
    """The path `text` names, after checking it can be created or replaced: its folder exists and
    it is not a folder itself (`x.dot/` included, which pathlib would read as `x.dot`)."""
    path = Path(text)
    if text.endswith(("/", os.sep)):
        raise CliError(f"{option} {text}: names a folder; give a file name")
    folder = path.parent
    if not folder.exists():
        raise CliError(f"{option} {path}: the folder {folder} does not exist; create it first")
    if not folder.is_dir():
        raise CliError(f"{option} {path}: {folder} is not a folder")
    if path.is_dir():
        raise CliError(f"{option} {path}: is a folder; give a file name")
    return path


def write_output_file(path: Path, text: str, option: str) -> None:
    """Write `text` to `path`; any OSError (no space, no permission) is a CliError naming the file."""
    try:
        path.write_text(text)
    except OSError as e:
        raise CliError(f"{option} {path}: cannot write it ({e.strerror or e})") from None


def check_output_folder(path: Path, option: str) -> None:
    """Raise CliError if `path` exists and is not a folder, or a part of it is a file."""
    for part in (path, *path.parents):
        if part.exists():
            if not part.is_dir():
                raise CliError(f"{option} {path}: {part} is not a folder")
            return
