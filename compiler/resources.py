"""Where flowc's shipped files are: the templates and headers of each backend.

Found through `importlib.resources`, so the answer is right in the source tree, in an editable
install and in a wheel alike.  The toolchains hand these folders to g++ and nvcc as `-I` paths,
so they must be real folders on disk (flowc is not zip-safe).

Example:
    >>> template_folder("cpu").name
    'cpu'
"""
from __future__ import annotations

import importlib.resources
from pathlib import Path

TEMPLATE_PACKAGE = "flowc.codegen_templates"


def template_folder(backend: str) -> Path:
    """The folder of `backend`'s templates and headers (`codegen_templates/<backend>`)."""
    folder = importlib.resources.files(TEMPLATE_PACKAGE).joinpath(backend)
    if not isinstance(folder, Path) or not folder.is_dir():
        raise FileNotFoundError(f"flowc's {backend!r} templates are not a folder on disk ({folder}); "
                                "reinstall flowc (it cannot run from a zip file)")
    return folder
