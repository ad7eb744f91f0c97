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

import contextlib
import inspect
import typing
from typing import Any, Callable, Iterator

import numpy as np

from flowc.compiler.errors import TraceError
from flowc.compiler.trace import Blob, WatchSpec, current, user_location
from flowc.runtime.signature import ListNumpy, Numpy

__all__ = ["watch", "watch_diff", "watch_scope"]


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


@contextlib.contextmanager
def watch_scope(blob_watcher: dict | Callable | None = None,
                diff_blob_watcher: dict | Callable | None = None) -> Iterator[None]:
    """`with flow.watch_scope(blob_watcher, diff_blob_watcher):` watches the value (and the gradient)
    of every Blob made inside the block, as `flow.watch` / `flow.watch_diff` would, once each.  A dict
    receives `{"<op name>/out": {"blob": value, "blob_def": blob}}` after each step (the value a
    LocalBlob: `.numpy()`; two ops of one name: the second is keyed by its `logical_blob_name`); a
    function is called as `f(value, blob)`.  Gradients come only for the Blobs the loss reaches
    through a trainable variable; the others are left out without a warning.

    Example:
        values, diffs = {}, {}
        with flow.watch_scope(values, diffs):
            hidden = flow.layers.dense(x, 8, activation=flow.nn.relu, name="fc1")
    """
    ctx = current("flow.watch_scope")
    scope = _WatchScope(ctx, _watcher(blob_watcher, "blob_watcher"), _watcher(diff_blob_watcher, "diff_blob_watcher"))
    ctx.watch_scopes.append(scope)
    try:
        yield
    finally:
        ctx.watch_scopes.remove(scope)


def _watcher(watcher: Any, arg: str) -> dict | Callable | None:
    if watcher is not None and not isinstance(watcher, dict) and not callable(watcher):
        raise TraceError(f"{user_location()}: flow.watch_scope: {arg} must be a dict, a function or None, got "
                         f"{type(watcher).__name__}")
    return watcher


class _WatchScope:
    """One `flow.watch_scope` block: the trace calls `watch_once` with every Blob made inside it."""

    def __init__(self, ctx, blob_watcher: dict | Callable | None, diff_blob_watcher: dict | Callable | None) -> None:
        self.ctx, self.blob_watcher, self.diff_blob_watcher = ctx, blob_watcher, diff_blob_watcher
        self.keys: dict[int, str] = {}        # Blob id -> its key in the dicts
        self.used: set[str] = set()            # the keys given so far (a block may make thousands of Blobs)

    def watch_once(self, blob: Blob) -> None:
        if blob.id in self.keys or blob.ctx is not self.ctx:
            return
        key = f"{blob.op_name}/out"               # OneFlow's unique_name: the op's name and its output's
        self.keys[blob.id] = key = blob.logical_blob_name if key in self.used else key
        self.used.add(key)
        loc = user_location()
        for kind, watcher in (("value", self.blob_watcher), ("diff", self.diff_blob_watcher)):
            if watcher is not None:
                handler = _deliver(watcher, blob, self.keys[blob.id])
                self.ctx.watches.append(WatchSpec(kind, blob.id, handler, "blob", loc, quiet=True))


def _deliver(watcher: dict | Callable, blob: Blob, key: str) -> Callable[[Any], None]:
    """OneFlow's callback of a watch scope: store the value under `key`, or call f(value, blob)."""
    if isinstance(watcher, dict):
        def store(value: Any) -> None:
            watcher[key] = {"blob": value, "blob_def": blob}
        return store

    def call(value: Any) -> None:
        watcher(value, blob)
    return call


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
