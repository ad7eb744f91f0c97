"""`flow.watch` and `flow.watch_diff`: a Blob's value (or its gradient) handed to a function at every step.

Inside a job function, `flow.watch(blob, handler)` asks for `blob`'s value and
`flow.watch_diff(blob, handler)` for the gradient of the loss with respect to it (train jobs).  At
every call the handler runs on the callback thread with the value of that step, converted by the
handler's parameter annotation as a job's result is (`tp.Numpy`: an ndarray; `tp.ListNumpy`: a list
with one ndarray per device, one here; no annotation: a LocalBlob with `.numpy()`, as in OneFlow).
Handlers run in call order, each call's in the order the job registered them, before the job's own
callback; a synchronous call returns once they have run.  An exception in a handler is kept and
raised like a callback's: by that synchronous call, or by the next sync point.

A watched Blob becomes an extra result of the step: it is stored by the kernel that computes it and
kept to the end of the step; a job without watches compiles exactly as before.  The value of a
watched variable is the one the forward pass read (before this step's update), as in OneFlow.

A diff is the one OneFlow's watcher sees: the backward pass seeded with ones (times the loss scale,
where the optimizer has one), before the variables' gradients are divided by the loss's instance
count.  As in OneFlow, `watch_diff` in a predict job, or on a Blob the loss does not reach through a
trainable variable (a placeholder, say), never calls its handler; flowc says so with a warning.
"""
from __future__ import annotations

import inspect
import typing
from typing import Any, Callable

import numpy as np

from flowc.compiler.errors import TraceError
from flowc.compiler.trace import Blob, WatchSpec, current, user_location
from flowc.runtime.signature import ListNumpy, Numpy

__all__ = ["watch", "watch_diff"]


def watch(blob_watched: Blob, handler_or_prompt: Callable[[Any], None] | str | None = None) -> None:
    """Call `handler_or_prompt` with `blob_watched`'s value after each step (a string or None: print it).

    Example:
        def show(y: tp.Numpy):
            print("relu out:", y)

        @flow.global_function()
        def relu_job(x: tp.Numpy.Placeholder((5,))) -> None:
            flow.watch(flow.nn.relu(x), show)
    """
    _register("value", "flow.watch", blob_watched, handler_or_prompt)


def watch_diff(blob_watched: Blob, handler_or_prompt: Callable[[Any], None] | str | None = None) -> None:
    """Call `handler_or_prompt` with the gradient of the loss w.r.t. `blob_watched` after each train step.

    Example:
        @flow.global_function(type="train")
        def train_job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
            w = flow.get_variable("w", shape=(3, 2), initializer=flow.ones_initializer())
            y = flow.matmul(x, w)
            flow.watch_diff(y, lambda dy: print(dy.numpy()))   # ones: the loss is sum(y)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(y)
            return y
    """
    _register("diff", "flow.watch_diff", blob_watched, handler_or_prompt)


def _register(kind: str, api: str, blob: Any, handler_or_prompt: Any) -> None:
    ctx = current(api)
    loc = user_location()
    if not isinstance(blob, Blob):
        raise TraceError(f"{loc}: {api}: blob_watched must be a Blob of the job, got {type(blob).__name__}")
    if blob.ctx is not ctx:
        raise TraceError(f"{loc}: {api}: blob_watched belongs to job {blob.ctx.job_name!r}, not to "
                         f"{ctx.job_name!r}, which is being traced")
    if callable(handler_or_prompt):
        handler, convert = handler_or_prompt, _conversion(handler_or_prompt, api, loc)
    elif handler_or_prompt is None or isinstance(handler_or_prompt, str):
        handler, convert = _printer(handler_or_prompt), "numpy"
    else:
        raise TraceError(f"{loc}: {api}: handler_or_prompt must be a function taking the value, a prompt "
                         f"string or None, got {type(handler_or_prompt).__name__}")
    ctx.watches.append(WatchSpec(kind, blob.id, handler, convert, loc))


def _conversion(handler: Callable, api: str, loc: str) -> str:
    """How the handler wants the value, from its one parameter's annotation; a TraceError otherwise."""
    try:
        sig = inspect.signature(handler)
    except (TypeError, ValueError):
        return "blob"                       # a builtin without a signature: OneFlow's unannotated case
    params = list(sig.parameters.values())
    try:
        sig.bind(object())
    except TypeError:
        names = ", ".join(p.name for p in params)
        raise TraceError(f"{loc}: {api}: the handler must take exactly one argument (the watched value); "
                         f"{getattr(handler, '__name__', handler)!r} takes ({names})") from None
    annotation = params[0].annotation if params else inspect.Parameter.empty
    if isinstance(annotation, str):
        try:
            annotation = typing.get_type_hints(handler).get(params[0].name, annotation)
        except Exception:  # noqa: BLE001 - an unresolvable string annotation is reported below
            pass
    if annotation is inspect.Parameter.empty:
        return "blob"
    if annotation is Numpy:
        return "numpy"
    if annotation is ListNumpy:
        return "list_numpy"
    raise TraceError(f"{loc}: {api}: the handler's parameter is annotated {annotation!r}; a watch handler "
                     f"takes tp.Numpy, tp.ListNumpy or no annotation (a LocalBlob)")


def _printer(prompt: str | None) -> Callable[[np.ndarray], None]:
    """OneFlow's handler for a prompt: print the prompt (if any), then the value."""
    def print_value(value: np.ndarray) -> None:
        if prompt is not None:
            print(prompt)
        print(value)
    return print_value
