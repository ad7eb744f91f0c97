"""Variable initializers with OneFlow's (v0.3) names, signatures and semantics.

An initializer is a small immutable object that knows *how* to fill a variable
but not its shape: `flow.get_variable(name, shape, dtype, initializer=...)`
hands it the shape and dtype once, when the variable is first created, through
the single method

    sample(shape, dtype, *, default_seed) -> np.ndarray

which returns a fresh C-contiguous array of exactly that shape and dtype.

Reproducibility rules (why they are what they are):

* Every random draw comes from `np.random.Generator(np.random.PCG64(seed))`.
  PCG64's stream is specified bit-for-bit by NumPy, so a given seed yields the
  same values in every process and on every platform; the global NumPy RNG is
  never touched, so user code that reseeds it cannot change a model.
* An initializer built without a `seed` uses `default_seed`, which the caller
  derives from the variable's name and the session seed with `seed_for`, so two
  runs of the same program start from the same weights by default, and two
  variables with different names get independent streams.
* Values are drawn in float64 and cast at the end, so a float32 and a float64
  variable initialized from the same seed hold the same numbers up to rounding.

Example:
    >>> init = random_normal_initializer(mean=0.0, stddev=0.1, seed=7)
    >>> w = init.sample((2, 3), np.dtype(np.float32), default_seed=0)
    >>> w.shape, w.dtype
    ((2, 3), dtype('float32'))
"""
from __future__ import annotations

import hashlib
import math
import numbers
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Initializer",
    "ConstantInitializer",
    "RandomUniformInitializer",
    "RandomNormalInitializer",
    "TruncatedNormalInitializer",
    "VarianceScalingInitializer",
    "constant_initializer",
    "zeros_initializer",
    "ones_initializer",
    "random_uniform_initializer",
    "random_normal_initializer",
    "truncated_normal_initializer",
    "truncated_normal",
    "glorot_uniform_initializer",
    "xavier_uniform_initializer",
    "glorot_normal_initializer",
    "xavier_normal_initializer",
    "variance_scaling_initializer",
    "kaiming_initializer",
    "compute_fans",
    "seed_for",
]

# Truncation point of the truncated normal, in standard deviations.  OneFlow and
# TensorFlow both redraw values farther than 2 stddev from the mean.
_TRUNCATE_AT = 2.0

# Standard deviation of a unit normal truncated to [-2, 2].  Variance scaling
# divides by it so that the *truncated* samples have variance scale/fan, as
# OneFlow's variance_scaling_initializer (copied from TensorFlow's) does.
_TRUNCATED_STDDEV_CORRECTION = 0.87962566103423978

_VS_MODES = ("fan_in", "fan_out", "fan_avg")
_VS_DISTRIBUTIONS = ("truncated_normal", "random_normal", "random_uniform")
_KAIMING_MODES = ("fan_in", "fan_out")
_KAIMING_DISTRIBUTIONS = ("random_normal", "random_uniform")


# --------------------------------------------------------------------------- helpers


def seed_for(name: str, session_seed: int) -> int:
    """A stable 63-bit seed for the variable `name` in a session seeded `session_seed`.

    Uses SHA-256 rather than `hash()`, whose value for strings changes from one
    process to the next (PYTHONHASHSEED), so the seed is the same everywhere.

    Example:
        >>> seed_for("conv1-weight", 0) == seed_for("conv1-weight", 0)
        True
        >>> 0 <= seed_for("fc-bias", 42) < 2**63
        True
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    session_seed = operator.index(session_seed)
    # The separator keeps ("a", 12) and ("a1", 2) from hashing the same bytes.
    digest = hashlib.sha256(f"{session_seed}\x00{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


def _to_np_dtype(dtype: Any, arg: str = "dtype") -> np.dtype:
    """NumPy dtype of a flow dtype (anything with `ir_name`), a name, or a NumPy dtype."""
    ir_name = getattr(dtype, "ir_name", None)
    try:
        return np.dtype(ir_name if ir_name is not None else dtype)
    except TypeError as exc:
        raise ValueError(f"{arg}: unsupported dtype {dtype!r}") from exc


def _optional_dtype(dtype: Any) -> np.dtype | None:
    return None if dtype is None else _to_np_dtype(dtype)


def _check_shape(shape: Any) -> tuple[int, ...]:
    try:
        dims = tuple(operator.index(d) for d in shape)
    except TypeError as exc:
        raise ValueError(f"shape must be a sequence of ints, got {shape!r}") from exc
    if any(d < 0 for d in dims):
        raise ValueError(f"shape must not have negative dimensions, got {dims}")
    return dims


def _check_seed(seed: Any, arg: str = "seed") -> int | None:
    if seed is None:
        return None
    if isinstance(seed, bool):
        raise ValueError(f"{arg} must be a non-negative int or None, got {seed!r}")
    try:
        value = operator.index(seed)
    except TypeError as exc:
        raise ValueError(f"{arg} must be a non-negative int or None, got {seed!r}") from exc
    if value < 0:
        raise ValueError(f"{arg} must be a non-negative int or None, got {value}")
    return value


def _check_real(value: Any, arg: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{arg} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{arg} must be finite, got {value}")
    return value


def _generator(seed: int | None, default_seed: int) -> np.random.Generator:
    chosen = seed if seed is not None else _check_seed(default_seed, "default_seed")
    return np.random.Generator(np.random.PCG64(chosen))


def _require_float(dtype: np.dtype, what: str) -> None:
    if dtype.kind != "f":
        raise ValueError(f"dtype: {what} needs a floating-point dtype, got {dtype}")


def _finish(values: Any, dtype: np.dtype) -> np.ndarray:
    # np.array, not np.ascontiguousarray: the latter turns a 0-d result into shape (1,).
    return np.array(values, dtype=dtype, order="C")


def _normal_float64(
    rng: np.random.Generator, shape: tuple[int, ...], truncate: bool
) -> np.ndarray:
    """Unit normal samples; with `truncate`, |z| > 2 are redrawn until none remain."""
    # np.array: for shape () the generator returns a scalar, which can't be assigned into.
    z = np.array(rng.standard_normal(shape))
    if truncate:
        # Redraw only the rejected entries (as OneFlow/TF do) rather than
        # clipping, which would pile probability mass onto the bounds.  About
        # 4.6% are rejected per round, so this loop ends after a few rounds.
        bad = np.abs(z) > _TRUNCATE_AT
        while bad.any():
            z[bad] = rng.standard_normal(int(bad.sum()))
            bad = np.abs(z) > _TRUNCATE_AT
    return z


def _normalize_data_format(data_format: Any) -> str:
    """'' (unspecified), 'channels_first' or 'channels_last'.

    Follows OneFlow's `_get_data_format`: names starting with "NC" (NCHW, NCW,
    NCDHW) are channels-first, other names starting with "N" and ending with
    "C" (NHWC, NWC) are channels-last.
    """
    if not isinstance(data_format, str):
        raise ValueError(f"data_format must be a str, got {data_format!r}")
    if data_format in ("", "channels_first", "channels_last"):
        return data_format
    if data_format.startswith("NC"):
        return "channels_first"
    if data_format.startswith("N") and data_format.endswith("C"):
        return "channels_last"
    raise ValueError(
        f"data_format must be '', 'NCHW' or 'NHWC' (or another N..C / NC.. layout), "
        f"got {data_format!r}"
    )


def compute_fans(shape: tuple[int, ...], data_format: str = "") -> tuple[float, float]:
    """(fan_in, fan_out) of a weight of `shape`, the way OneFlow computes them.

    OneFlow stores a dense weight as (out, in), a channels-first conv weight as
    (out, in/groups, kh, kw) and a channels-last one as (out, kh, kw, in), so:

    * 2-D: fan_in = shape[1], fan_out = shape[0];
    * N-D channels-first: fan_in = prod(shape[1:]), fan_out = shape[0] * prod(shape[2:]);
    * N-D channels-last: fan_in = prod(shape[1:]), fan_out = shape[0] * prod(shape[1:-1]).

    Deviations, because OneFlow rejects these cases outright: a 1-D shape uses
    its length for both fans and a 0-D shape uses 1 (TensorFlow's choice), and
    an N-D shape with data_format "" is treated as channels-first, flow's
    default layout.

    Example:
        >>> compute_fans((512, 784))
        (784.0, 512.0)
        >>> compute_fans((32, 1, 5, 5), "NCHW")
        (25.0, 800.0)
    """
    shape = _check_shape(shape)
    layout = _normalize_data_format(data_format)
    if len(shape) == 0:
        return 1.0, 1.0
    if len(shape) == 1:
        return float(shape[0]), float(shape[0])
    if len(shape) == 2:
        return float(shape[1]), float(shape[0])
    fan_in = float(math.prod(shape[1:]))
    if layout == "channels_last":
        receptive = math.prod(shape[1:-1])
    else:
        receptive = math.prod(shape[2:])
    return fan_in, float(shape[0] * receptive)


_GAINS = {
    "linear": 1.0,
    "conv1d": 1.0,
    "conv2d": 1.0,
    "conv3d": 1.0,
    "sigmoid": 1.0,
    "tanh": 5.0 / 3.0,
    "relu": math.sqrt(2.0),
}


def _gain(nonlinearity: str, negative_slope: float) -> float:
    # Same table as OneFlow's `_CalcGain` (itself PyTorch's calculate_gain).
    if nonlinearity == "leaky_relu":
        return math.sqrt(2.0 / (1.0 + negative_slope**2))
    if nonlinearity in _GAINS:
        return _GAINS[nonlinearity]
    known = ", ".join(sorted([*_GAINS, "leaky_relu"]))
    raise ValueError(f"nonlinearity must be one of {known}; got {nonlinearity!r}")


# --------------------------------------------------------------------------- classes


class Initializer:
    """Base class: an immutable recipe for a variable's first value.

    Subclasses implement `sample`; they are frozen dataclasses, so they can be
    compared, hashed and printed, and are safe to share between variables.
    """

    def sample(
        self, shape: tuple[int, ...], dtype: np.dtype, *, default_seed: int
    ) -> np.ndarray:
        """A new C-contiguous array of `shape` and `dtype`.

        `default_seed` is used when the initializer was built without a seed.
        """
        raise NotImplementedError


@dataclass(frozen=True)
class ConstantInitializer(Initializer):
    """Every element equals `value` (cast to the variable's dtype).

    Example:
        >>> ConstantInitializer(2.5).sample((2,), np.dtype("float32"), default_seed=0)
        array([2.5, 2.5], dtype=float32)
    """

    value: float = 0.0
    dtype: np.dtype | None = None

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, numbers.Real):
            raise ValueError(f"value must be a real number, got {self.value!r}")
        object.__setattr__(self, "dtype", _optional_dtype(self.dtype))

    def sample(
        self, shape: tuple[int, ...], dtype: np.dtype, *, default_seed: int
    ) -> np.ndarray:
        return np.full(_check_shape(shape), self.value, dtype=_to_np_dtype(dtype))


@dataclass(frozen=True)
class RandomUniformInitializer(Initializer):
    """Uniform samples in [minval, maxval).

    For an integer variable the values are integers in [minval, maxval), like
    OneFlow's int uniform initializer.

    Example:
        >>> init = RandomUniformInitializer(-1.0, 1.0, seed=3)
        >>> x = init.sample((1000,), np.dtype("float64"), default_seed=0)
        >>> bool((x >= -1).all() and (x < 1).all())
        True
    """

    minval: float = 0.0
    maxval: float = 1.0
    seed: int | None = None
    dtype: np.dtype | None = None

    def __post_init__(self) -> None:
        lo = _check_real(self.minval, "minval")
        hi = _check_real(self.maxval, "maxval")
        if lo > hi:
            raise ValueError(f"minval must be <= maxval, got minval={lo}, maxval={hi}")
        object.__setattr__(self, "minval", lo)
        object.__setattr__(self, "maxval", hi)
        object.__setattr__(self, "seed", _check_seed(self.seed))
        object.__setattr__(self, "dtype", _optional_dtype(self.dtype))

    def sample(
        self, shape: tuple[int, ...], dtype: np.dtype, *, default_seed: int
    ) -> np.ndarray:
        shape, dtype = _check_shape(shape), _to_np_dtype(dtype)
        rng = _generator(self.seed, default_seed)
        if dtype.kind in "iu":
            low, high = math.ceil(self.minval), math.ceil(self.maxval)
            if low >= high:
                raise ValueError(
                    f"minval/maxval: no integer in [{self.minval}, {self.maxval}) "
                    f"for an {dtype} variable"
                )
            return _finish(rng.integers(low, high, size=shape, dtype=np.int64), dtype)
        _require_float(dtype, "random_uniform_initializer")
        values = _finish(rng.uniform(self.minval, self.maxval, size=shape), dtype)
        if self.maxval > self.minval and values.size:
            # A float64 draw just below maxval can round up to maxval when cast
            # to float32; clamp so the half-open interval holds in every dtype.
            top = np.nextafter(dtype.type(self.maxval), dtype.type(-np.inf))
            np.minimum(values, top, out=values)
        return values


@dataclass(frozen=True)
class _NormalBase(Initializer):
    """Shared fields and validation of the plain and the truncated normal."""

    mean: float = 0.0
    stddev: float = 1.0
    seed: int | None = None
    dtype: np.dtype | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", _check_real(self.mean, "mean"))
        stddev = _check_real(self.stddev, "stddev")
        if stddev < 0:
            raise ValueError(f"stddev must be >= 0, got {stddev}")
        object.__setattr__(self, "stddev", stddev)
        object.__setattr__(self, "seed", _check_seed(self.seed))
        dtype = _optional_dtype(self.dtype)
        if dtype is not None:
            _require_float(dtype, type(self).__name__)
        object.__setattr__(self, "dtype", dtype)

    # Class constant, not a field (no annotation): the subclasses differ only here.
    _truncate = False

    def sample(
        self, shape: tuple[int, ...], dtype: np.dtype, *, default_seed: int
    ) -> np.ndarray:
        shape, dtype = _check_shape(shape), _to_np_dtype(dtype)
        _require_float(dtype, type(self).__name__)
        z = _normal_float64(_generator(self.seed, default_seed), shape, self._truncate)
        return _finish(self.mean + self.stddev * z, dtype)


@dataclass(frozen=True)
class RandomNormalInitializer(_NormalBase):
    """Normal samples with the given mean and standard deviation.

    Example:
        >>> init = RandomNormalInitializer(0.0, 0.01, seed=1)
        >>> init.sample((3, 4), np.dtype("float32"), default_seed=0).dtype
        dtype('float32')
    """


@dataclass(frozen=True)
class TruncatedNormalInitializer(_NormalBase):
    """Normal samples, with values outside mean +/- 2*stddev redrawn.

    `stddev` is that of the normal before truncation (OneFlow/TF semantics), so
    the samples' own standard deviation is about 0.88 * stddev.

    Example:
        >>> init = TruncatedNormalInitializer(0.0, 1.0, seed=0)
        >>> x = init.sample((10000,), np.dtype("float64"), default_seed=0)
        >>> bool(np.abs(x).max() <= 2.0)
        True
    """

    _truncate = True


@dataclass(frozen=True)
class VarianceScalingInitializer(Initializer):
    """Samples whose variance is `scale / fan`, fan taken from the variable's shape.

    The fan is fan_in, fan_out or their mean (`mode`); see `compute_fans` for
    how `data_format` decides them.  `distribution` is:

    * "random_uniform": uniform in [-limit, limit), limit = sqrt(3 * scale / fan);
    * "random_normal": normal, stddev = sqrt(scale / fan);
    * "truncated_normal": truncated at 2 sigma, stddev = sqrt(scale / fan) / 0.8796...,
      so the truncated samples still have variance scale / fan (OneFlow/TF).

    Example:
        >>> init = VarianceScalingInitializer(1.0, "fan_avg", "random_uniform", "")
        >>> w = init.sample((512, 784), np.dtype("float32"), default_seed=5)
        >>> bool(np.abs(w).max() <= (6 / (512 + 784)) ** 0.5)
        True
    """

    scale: float = 1.0
    mode: str = "fan_in"
    distribution: str = "truncated_normal"
    data_format: str = ""
    seed: int | None = None

    def __post_init__(self) -> None:
        scale = _check_real(self.scale, "scale")
        if scale <= 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        object.__setattr__(self, "scale", scale)
        if self.mode not in _VS_MODES:
            raise ValueError(f"mode must be one of {', '.join(_VS_MODES)}; got {self.mode!r}")
        if self.distribution not in _VS_DISTRIBUTIONS:
            raise ValueError(
                f"distribution must be one of {', '.join(_VS_DISTRIBUTIONS)}; "
                f"got {self.distribution!r}"
            )
        _normalize_data_format(self.data_format)  # validate now, not at first use
        object.__setattr__(self, "seed", _check_seed(self.seed))

    def _fan(self, shape: tuple[int, ...]) -> float:
        fan_in, fan_out = compute_fans(shape, self.data_format)
        fan = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2.0}[
            self.mode
        ]
        # An empty weight has fan 0; any positive value gives the same (empty) result.
        return max(fan, 1.0)

    def sample(
        self, shape: tuple[int, ...], dtype: np.dtype, *, default_seed: int
    ) -> np.ndarray:
        shape, dtype = _check_shape(shape), _to_np_dtype(dtype)
        _require_float(dtype, "variance_scaling_initializer")
        fan = self._fan(shape)
        inner: Initializer
        if self.distribution == "random_uniform":
            limit = math.sqrt(3.0 * self.scale / fan)
            inner = RandomUniformInitializer(-limit, limit, seed=self.seed)
        elif self.distribution == "random_normal":
            inner = RandomNormalInitializer(0.0, math.sqrt(self.scale / fan), seed=self.seed)
        else:
            stddev = math.sqrt(self.scale / fan) / _TRUNCATED_STDDEV_CORRECTION
            inner = TruncatedNormalInitializer(0.0, stddev, seed=self.seed)
        return inner.sample(shape, dtype, default_seed=default_seed)


# --------------------------------------------------------------------------- factories
# Names, parameter order and defaults are OneFlow's public API (oneflow v0.3,
# plus the `seed` keyword its later versions added); `dtype` accepts a flow
# dtype, a NumPy dtype or a dtype name.  The variable's own dtype decides the
# sampled dtype; the initializer's `dtype` is kept as information.


def constant_initializer(value: float = 0, dtype: Any = np.float32) -> ConstantInitializer:
    """Initializer that fills a variable with `value`.

    Example:
        >>> constant_initializer(0.5).sample((2, 2), np.dtype("float32"), default_seed=0)
        array([[0.5, 0.5],
               [0.5, 0.5]], dtype=float32)
    """
    return ConstantInitializer(value, dtype)


def zeros_initializer(dtype: Any = np.float32) -> ConstantInitializer:
    """Initializer that fills a variable with 0.

    Example:
        >>> zeros_initializer().sample((3,), np.dtype("int32"), default_seed=0)
        array([0, 0, 0], dtype=int32)
    """
    return ConstantInitializer(0.0, dtype)


def ones_initializer(dtype: Any = np.float32) -> ConstantInitializer:
    """Initializer that fills a variable with 1.

    Example:
        >>> ones_initializer().sample((2,), np.dtype("float64"), default_seed=0)
        array([1., 1.])
    """
    return ConstantInitializer(1.0, dtype)


def random_uniform_initializer(
    minval: float = 0, maxval: float = 1, dtype: Any = np.float32, seed: int | None = None
) -> RandomUniformInitializer:
    """Initializer drawing uniformly from [minval, maxval).

    Raises ValueError if minval > maxval.

    Example:
        >>> init = random_uniform_initializer(-0.1, 0.1, seed=1)
        >>> init.sample((4, 4), np.dtype("float32"), default_seed=0).shape
        (4, 4)
    """
    return RandomUniformInitializer(minval, maxval, seed, dtype)


def random_normal_initializer(
    mean: float = 0.0, stddev: float = 1.0, seed: int | None = None, dtype: Any = None
) -> RandomNormalInitializer:
    """Initializer drawing from a normal distribution N(mean, stddev**2).

    Raises ValueError if stddev < 0.

    Example:
        >>> init = random_normal_initializer(stddev=0.02, seed=0)
        >>> init.sample((8,), np.dtype("float32"), default_seed=0).shape
        (8,)
    """
    return RandomNormalInitializer(mean, stddev, seed, dtype)


def truncated_normal_initializer(
    mean: float = 0.0, stddev: float = 1.0, seed: int | None = None, dtype: Any = None
) -> TruncatedNormalInitializer:
    """Initializer drawing from N(mean, stddev**2), redrawing values beyond 2 stddev.

    Example:
        >>> init = truncated_normal_initializer(stddev=0.1, seed=0)
        >>> bool(np.abs(init.sample((1000,), np.dtype("float64"), default_seed=0)).max() <= 0.2)
        True
    """
    return TruncatedNormalInitializer(mean, stddev, seed, dtype)


def truncated_normal(stddev: float = 1.0, seed: int | None = None) -> TruncatedNormalInitializer:
    """Shorthand for `truncated_normal_initializer(0.0, stddev, seed)`.

    This is the spelling OneFlow's tutorials use: `flow.truncated_normal(0.1)`.

    Example:
        >>> truncated_normal(0.1).stddev
        0.1
    """
    return TruncatedNormalInitializer(0.0, stddev, seed)


def variance_scaling_initializer(
    scale: float = 1.0,
    mode: str = "fan_in",
    distribution: str = "truncated_normal",
    data_format: str = "",
) -> VarianceScalingInitializer:
    """Initializer with variance `scale / fan` (see `VarianceScalingInitializer`).

    mode: "fan_in" | "fan_out" | "fan_avg";
    distribution: "truncated_normal" | "random_normal" | "random_uniform";
    data_format: "" | "NCHW" | "NHWC" (decides the fans of conv weights).

    Example:
        >>> init = variance_scaling_initializer(2.0, "fan_in", "random_normal", "NCHW")
        >>> init.sample((16, 3, 3, 3), np.dtype("float32"), default_seed=1).shape
        (16, 3, 3, 3)
    """
    return VarianceScalingInitializer(scale, mode, distribution, data_format)


def glorot_uniform_initializer(data_format: str = "") -> VarianceScalingInitializer:
    """Glorot/Xavier uniform: U(-limit, limit), limit = sqrt(6 / (fan_in + fan_out)).

    Example:
        >>> w = glorot_uniform_initializer().sample((512, 784), np.dtype("float32"), default_seed=0)
        >>> bool(np.abs(w).max() <= (6 / 1296) ** 0.5)
        True
    """
    # OneFlow defines it exactly so: variance scaling, scale 1, fan_avg, uniform.
    return VarianceScalingInitializer(1.0, "fan_avg", "random_uniform", data_format)


def glorot_normal_initializer(data_format: str = "") -> VarianceScalingInitializer:
    """Glorot/Xavier normal: N(0, 2 / (fan_in + fan_out)), not truncated.

    Example:
        >>> init = glorot_normal_initializer("NCHW")
        >>> init.sample((32, 1, 5, 5), np.dtype("float32"), default_seed=0).shape
        (32, 1, 5, 5)
    """
    # OneFlow: variance scaling, scale 1, fan_avg, random_normal.
    return VarianceScalingInitializer(1.0, "fan_avg", "random_normal", data_format)


xavier_uniform_initializer = glorot_uniform_initializer
xavier_normal_initializer = glorot_normal_initializer


def kaiming_initializer(
    shape: tuple[int, ...],
    distribution: str = "random_normal",
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    negative_slope: float = 0.0,
    data_format: str = "NCHW",
) -> RandomNormalInitializer | RandomUniformInitializer:
    """He/Kaiming initializer for a weight of `shape` (dense, conv or deconv).

    As in OneFlow, the shape is given up front: the fan is computed here,
    std = gain / sqrt(fan), and the result is a plain initializer:
    N(0, std**2) for "random_normal", or U(-sqrt(3)*std, sqrt(3)*std) for
    "random_uniform".  gain is sqrt(2 / (1 + negative_slope**2)) for
    "leaky_relu" (so sqrt(2), i.e. ReLU, by default), sqrt(2) for "relu",
    5/3 for "tanh", and 1 for "linear", "conv1d/2d/3d" and "sigmoid".

    Example:
        >>> init = kaiming_initializer((64, 3, 3, 3))
        >>> round(init.stddev, 6) == round((2 / 27) ** 0.5, 6)
        True
    """
    dims = _check_shape(shape)
    if len(dims) < 2:
        # OneFlow: Kaiming initialization only deals with FC, conv and deconv weights.
        raise ValueError(f"shape must have at least 2 dimensions, got {dims}")
    if math.prod(dims) == 0:
        raise ValueError(f"shape must have no zero dimension, got {dims}")
    if distribution not in _KAIMING_DISTRIBUTIONS:
        raise ValueError(
            f"distribution must be one of {', '.join(_KAIMING_DISTRIBUTIONS)}; "
            f"got {distribution!r}"
        )
    if mode not in _KAIMING_MODES:
        raise ValueError(f"mode must be one of {', '.join(_KAIMING_MODES)}; got {mode!r}")
    if data_format not in ("NCHW", "NHWC", "channels_first", "channels_last"):
        raise ValueError(f"data_format must be 'NCHW' or 'NHWC', got {data_format!r}")
    slope = _check_real(negative_slope, "negative_slope")
    fan_in, fan_out = compute_fans(dims, data_format)
    std = _gain(nonlinearity, slope) / math.sqrt(fan_in if mode == "fan_in" else fan_out)
    if distribution == "random_normal":
        return RandomNormalInitializer(0.0, std)
    bound = math.sqrt(3.0) * std
    return RandomUniformInitializer(-bound, bound)
