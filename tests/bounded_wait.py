"""`within`: run a call that could hang on a thread, and fail the test, not hang the suite, if it
has not returned in time (the runtime tests' guard against the waits they check)."""
from __future__ import annotations

import threading
from typing import Any, Callable


def within(action: Callable[[], Any], seconds: float = 60.0) -> Any:
    """`action()`'s value, or its exception; an AssertionError if it has not returned in `seconds`."""
    out: list = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(action())
        except BaseException as err:  # noqa: BLE001 - handed to the test
            errors.append(err)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{getattr(action, '__name__', action)} did not return within {seconds} s"
    if errors:
        raise errors[0]
    return out[0]
