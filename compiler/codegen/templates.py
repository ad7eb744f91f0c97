"""The Jinja2 environment both code generators render through.

Templates are StrictUndefined (a missing context value is an error, never an empty string).
There is no bytecode cache: compiling the templates a job uses costs about 12 ms once per
process (all fourteen of a backend: about 50 ms), and a cached template is code that every
process would load from disk, keyed by the template's text but not by the environment that
compiled it -- not worth trusting a folder for.
"""
from __future__ import annotations

import jinja2

from flowc.compiler.codegen.sanitise import CodegenEnvironment
from flowc.compiler.resources import template_folder


def environment(backend: str) -> jinja2.Environment:
    """The environment for `codegen_templates/<backend>/` ("cpu" or "cuda")."""
    return CodegenEnvironment(loader=jinja2.FileSystemLoader(str(template_folder(backend))),
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              keep_trailing_newline=False)
