"""flowc's compiler (trace, IR, passes, code generation, build): imported as `flowc.compiler`."""

# The folder lives at the top of the repository, so a program started there could also import it as
# `compiler`: that would load a second copy of every module (and a second op registry).  Refuse it.
if __name__ != "flowc.compiler":
    raise ImportError(f"flowc's `compiler` package is imported as `flowc.compiler`, not as `{__name__}` "
                      "(install flowc with `pip install .` or `pip install -e .`, and import `flow` or `flowc`)")
