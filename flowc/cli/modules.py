"""Finding a user's jobs: import their module without running its `__main__` block.

`flowc compile train.py` must not start the training loop, so the module is
imported under its own name (as `import train` would), with its folder first on
`sys.path` so the imports beside it resolve.  Every way this can go wrong is a
`CliError` with exit code 2 and one line saying what to fix.
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Iterable, Iterator


class CliError(Exception):
    """A failure the user fixes: printed as one line (plus `details`), exit code `code`."""

    def __init__(self, message: str, code: int = 2, details: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.details = details


class ProcessExitRefused(BaseException):
    """The user's code called `os._exit` while a flowc command ran it (a BaseException, so that the
    user's own `except Exception` cannot swallow it)."""

    def __init__(self, code: object) -> None:
        super().__init__(f"os._exit({code!r})")
        self.code = code

    def where(self) -> str:
        """`file:line` of the call: the innermost frame outside this module."""
        frames = [f for f in traceback.extract_tb(self.__traceback__)
                  if Path(f.filename).resolve() != Path(__file__).resolve()]
        return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "<unknown>"


@contextlib.contextmanager
def refusing_os_exit() -> Iterator[None]:
    """While a command imports and traces the user's module, `os._exit` raises ProcessExitRefused.

    os._exit ends the process at once, with the code the user's module chose (0 in the case that
    made this): `flowc compile` would report success having compiled nothing.  A forked child
    (multiprocessing ends its children with os._exit) still exits: only this process is guarded.
    """
    real_exit = os._exit
    guarded_pid = os.getpid()

    def refuse(code: int) -> None:
        if os.getpid() != guarded_pid:
            real_exit(code)
        raise ProcessExitRefused(code)

    os._exit = refuse     # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit = real_exit


@dataclass(frozen=True)
class JobRef:
    """`MODULE.py` or `MODULE.py:JOB` as typed on the command line."""
    module: str
    job: str | None

    @classmethod
    def parse(cls, text: str) -> JobRef:
        module, _, job = text.partition(":")
        return cls(module, job or None)


def load_module(path_text: str) -> ModuleType:
    """Import the file `path_text` as a module whose `__name__` is its stem (not "__main__")."""
    path = Path(path_text)
    if path.suffix != ".py":
        raise CliError(f"{path_text}: expected a Python file (MODULE.py)")
    if not path.is_file():
        raise CliError(f"no such module file: {path_text}")
    path = path.resolve()
    name = path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None      # a .py file always has a spec and a loader
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        where = f"{e.filename}:{e.lineno}" if e.lineno else str(path)
        code = f": {e.text.strip()}" if e.text else ""
        raise CliError(f"syntax error in {where}: {e.msg}{code}") from None
    except BaseException as e:       # SystemExit and KeyboardInterrupt from the module are errors too
        sys.modules.pop(name, None)
        if isinstance(e, KeyboardInterrupt):
            raise
        if isinstance(e, ProcessExitRefused):
            raise CliError(f"importing {path_text} called {e}, which would end flowc before it compiled "
                           f"anything; put that code under `if __name__ == \"__main__\":`",
                           details=_user_traceback(e, path)) from None
        raise CliError(f"importing {path_text} raised {type(e).__name__}: {e}",
                       details=_user_traceback(e, path)) from None
    return module


def _user_traceback(error: BaseException, path: Path) -> str:
    """The traceback from the user's module down, without flowc's import machinery above it."""
    frames = traceback.extract_tb(error.__traceback__)
    start = next((i for i, f in enumerate(frames) if Path(f.filename).resolve() == path), 0)
    end = len(frames)
    while end > start + 1 and Path(frames[end - 1].filename).resolve() == Path(__file__).resolve():
        end -= 1                          # refusing_os_exit's own frame: the user's call is the news
    lines = ["Traceback (most recent call last):\n"] + traceback.format_list(frames[start:end])
    return "".join(lines + traceback.format_exception_only(type(error), error)).rstrip()


FACTORY = "make_jobs"     # the model zoo's way (examples/models): the jobs are built inside a function


def _collect_jobs(values: Iterable[object]) -> dict:
    """name -> job of the JobFunctions among `values` (the first of each name)."""
    from flowc.runtime.job import JobFunction
    jobs: dict = {}
    for value in values:
        if isinstance(value, JobFunction) and value.name not in jobs:
            jobs[value.name] = value
    return jobs


def _jobs_of_factory(module: ModuleType) -> list:
    """What the module's `make_jobs()` returns (a job, or a tuple, list, named tuple or dict of them),
    called with no arguments: a module that builds its jobs inside a function names its default build
    by giving that function's parameters defaults."""
    factory = getattr(module, FACTORY, None)
    if not callable(factory):
        return []
    required = [p.name for p in inspect.signature(factory).parameters.values()
                if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD,
                                                                      p.KEYWORD_ONLY)]
    if required:
        raise CliError(f"{Path(module.__file__ or module.__name__).name} has no job at module level and its "
                       f"{FACTORY}() needs arguments ({', '.join(required)}); give them defaults")
    built = factory()
    if isinstance(built, dict):
        return list(built.values())
    return list(built) if isinstance(built, (tuple, list)) else [built]


def find_jobs(module: ModuleType, names: list[str] | None = None) -> list:
    """The module's `@flow.global_function` jobs (all, or those named), in definition order: those at
    module level, or else those a module-level `make_jobs()` (no arguments) returns."""
    jobs = _collect_jobs(vars(module).values())
    if not jobs:
        jobs = _collect_jobs(_jobs_of_factory(module))
    if not jobs:
        raise CliError(f"no @flow.global_function found in {module.__file__} (at module level, or returned "
                       f"by a module-level `{FACTORY}()`)")
    if not names:
        return list(jobs.values())
    unknown = [n for n in names if n not in jobs]
    if unknown:
        raise CliError(f"{Path(module.__file__ or module.__name__).name} has no job {unknown[0]!r}; "
                       f"its jobs are: {', '.join(jobs)}")
    return [jobs[n] for n in names]


def jobs_of(ref_text: str, extra_names: list[str] | None = None) -> list:
    """The jobs a `MODULE.py[:JOB]` argument (plus `--job` names) selects."""
    ref = JobRef.parse(ref_text)
    names = ([ref.job] if ref.job else []) + list(extra_names or [])
    return find_jobs(load_module(ref.module), names)
