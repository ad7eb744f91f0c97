"""`flow.random`: OneFlow 0.3.4's random ops, in a traced graph.

Every draw is a counter-based hash of (seed, step, element index), as `flow.nn.dropout`'s mask: no
state, the same values in every run under the same seed, new values every step of a train job and
every call of a predict job (as OneFlow's random kernels draw anew each time).  Without a seed the
seed comes from the op's name and the session's seed (`flow.config.seed`-style reproducibility:
a program draws the same numbers each time it runs), where OneFlow draws a seed from Python's
`random` module.

Example:
    mask = flow.random.bernoulli(probabilities, seed=1)
    rows = flow.random.shuffle(images)
"""
from __future__ import annotations

import itertools
import sys

from flowc.compiler.errors import TraceError
from flowc.compiler.ir import dtype_name
from flowc.compiler.trace import Blob, current, emit, user_location
from flow._ops import check_blob

_gen_seed_calls = itertools.count()


def _seed(seed: int | None, name: str, api: str) -> int:
    """The op's 64-bit seed: `seed` if given, else one from the (unique) op name and the session's seed."""
    from flowc.runtime.initializers import seed_for
    ctx = current(api)
    if seed is None:
        return seed_for(ctx.unique_name(name), ctx.session.seed)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TraceError(f"{user_location()}: {api}: seed must be an int or None, got {seed!r}")
    return seed % 2 ** 64


def _uniform(shape: tuple, dtype: str, seed: int, api: str, name: str = "") -> Blob:
    """Uniform values in [0, 1) of `shape`, drawn anew each step (or call)."""
    step = emit("scalar", [], {"name": "train_step", "shape": (), "dtype": "int64"}, api=api)
    return emit("random_uniform", [step], {"shape": tuple(shape), "dtype": dtype, "seed": seed}, name=name, api=api)


def bernoulli(x, seed: int | None = None, dtype=None, name: str = "Bernoulli") -> Blob:
    """`flow.random.bernoulli(x, seed=None, dtype=None)`: 1 with probability `x` (elementwise), else 0,
    in `dtype` (default: `x`'s dtype).  A probability <= 0 always gives 0, >= 1 always 1.

    Example:
        keep = flow.random.bernoulli(flow.constant_like(x, 0.9), seed=7)
    """
    api = "flow.random.bernoulli"
    p = check_blob(x, api, "x")
    if p.type.dtype not in ("float32", "float64"):
        raise TraceError(f"{user_location()}: {api}: x must be float32 or float64 probabilities, "
                         f"got {p.type.dtype}")
    out_dtype = p.type.dtype if dtype is None else dtype_name(dtype)
    u = _uniform(p.shape, p.type.dtype, _seed(seed, name or "Bernoulli", api), api)
    hit = emit("less", [u, p], api=api)
    return emit("cast", [hit], {"dtype": out_dtype}, name=name or "", api=api)


def generate_random_batch_permutation_indices(value, seed: int | None = None, name: str | None = None) -> Blob:
    """`flow.random.generate_random_batch_permutation_indices(value, seed=None)`: a random permutation
    of range(value.shape[0]) as int32 (a new one each step or call).

    Example:
        order = flow.random.generate_random_batch_permutation_indices(images)
    """
    from flow.more_ops import argsort
    api = "flow.random.generate_random_batch_permutation_indices"
    v = check_blob(value, api, "value")
    if not v.shape:
        raise TraceError(f"{user_location()}: {api}: value must have a batch axis, got a scalar")
    keys = _uniform((v.shape[0],), "float32", _seed(seed, name or "RandomBatchPermutation", api), api)
    order = argsort(keys)
    return emit("reshape", [order], {"shape": (v.shape[0],)}, name=name or "", api=api)


def shuffle(value, seed: int | None = None, name: str | None = None) -> Blob:
    """`flow.random.shuffle(value, seed=None)`: `value`'s rows (axis 0) in a random order, a new one
    each step or call: `flow.gather(value, generate_random_batch_permutation_indices(value, seed))`.

    Example:
        batch = flow.random.shuffle(batch, seed=3)
    """
    from flow.indexing import gather
    order = generate_random_batch_permutation_indices(value, seed)
    return gather(value, order, name=name)


def coin_flip(batch_size: int = 1, seed: int | None = None, probability: float = 0.5,
              name: str = "CoinFlip") -> Blob:
    """`flow.random.coin_flip(batch_size=1, seed=None, probability=0.5)` (also `CoinFlip`): int8 of
    shape (batch_size,), 1 with probability `probability`, else 0.

    Example:
        mirror = flow.random.coin_flip(batch_size=8, probability=0.5)
    """
    api = "flow.random.coin_flip"
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise TraceError(f"{user_location()}: {api}: batch_size must be a positive int, got {batch_size!r}")
    try:
        prob = float(probability)
    except (TypeError, ValueError):
        raise TraceError(f"{user_location()}: {api}: probability must be a number, got {probability!r}") from None
    if not 0.0 <= prob <= 1.0:
        raise TraceError(f"{user_location()}: {api}: probability must be in [0, 1], got {prob}")
    u = _uniform((batch_size,), "float32", _seed(seed, name or "CoinFlip", api), api)
    threshold = emit("constant", [], {"value": prob, "shape": (), "dtype": "float32"}, api=api)
    hit = emit("less", [u, threshold], api=api)
    return emit("cast", [hit], {"dtype": "int8"}, name=name or "", api=api)


CoinFlip = coin_flip


def gen_seed(seed: int | None = None) -> tuple[int, bool]:
    """`flow.random.gen_seed(seed=None)`: OneFlow's (seed, has_seed) pair for random ops.  A given
    seed is returned with True.  Without one: in the mirrored view (-1, False), as OneFlow; in the
    consistent view a seed with True, which flowc draws from a counter and the session's seed (the
    same sequence each run), where OneFlow draws it from Python's `random`.

    Example:
        seed, has_seed = flow.random.gen_seed(42)      # (42, True)
    """
    from flow.more_ops import _logical_view
    from flowc.runtime.initializers import seed_for
    from flowc.runtime.session import default_session
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"flow.random.gen_seed: seed must be an int or None, got {seed!r}")
        return seed, True
    if _logical_view() == "mirrored":
        return -1, False
    drawn = seed_for(f"gen_seed:{next(_gen_seed_calls)}", default_session().seed)
    return drawn % sys.maxsize, True


__all__ = ["bernoulli", "CoinFlip", "coin_flip", "gen_seed", "generate_random_batch_permutation_indices",
           "shuffle"]
