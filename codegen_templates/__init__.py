"""flowc's code templates (Jinja2 and C++/CUDA headers): imported as `flowc.codegen_templates`."""

# The folder lives at the top of the repository, so a program started there could also import it as
# `codegen_templates`: that would load a second copy of every module (and a second op registry).  Refuse it.
if __name__ != "flowc.codegen_templates":
    raise ImportError("flowc's `codegen_templates` package is imported as `flowc.codegen_templates`, "
                      f"not as `{__name__}` "
                      "(install flowc with `pip install .` or `pip install -e .`, and import `flow` or `flowc`)")
