"""flowc's runtime (jobs, sessions, actors, loaded steps): imported as `flowc.runtime`."""

# The folder lives at the top of the repository, so a program started there could also import it as
# `runtime`: that would load a second copy of every module (and a second op registry).  Refuse it.
if __name__ != "flowc.runtime":
    raise ImportError(f"flowc's `runtime` package is imported as `flowc.runtime`, not as `{__name__}` "
                      "(install flowc with `pip install .` or `pip install -e .`, and import `flow` or `flowc`)")
