"""The Jinja2 environment both code generators render through.

Templates are StrictUndefined (a missing context value is an error, never an empty string).
Their compiled form is kept in a bytecode cache beside the core library (`$FLOWC_CORE_DIR`/
templates): parsing and compiling the templates took ~0.1 s of a job's first call, every process.
"""
from __future__ import annotations

from pathlib import Path

import jinja2

from flowc.compiler.codegen.sanitise import CodegenEnvironment, TaggedLoader
from flowc.compiler.resources import template_folder


class _LazyFolderBytecodeCache(jinja2.FileSystemBytecodeCache):
    """A file bytecode cache whose folder is made when the first template is stored, not at import."""

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        super().dump_bytecode(bucket)


def environment(backend: str) -> jinja2.Environment:
    """The environment for `codegen_templates/<backend>/` ("cpu" or "cuda")."""
    from flowc.compiler.core_library import core_dir
    return CodegenEnvironment(loader=TaggedLoader(str(template_folder(backend))),
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              keep_trailing_newline=False,
                              bytecode_cache=_LazyFolderBytecodeCache(str(core_dir() / "templates")))
