"""Tests of runtime.initializers: reproducibility, distributions, fans, arguments."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flowc.runtime import initializers as I

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
REPO_ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------- reproducibility

_CHILD = """
import json, sys
import numpy as np
from flowc.runtime import initializers as I
# Disturb the global RNG: seeded initializers must not depend on it.
np.random.seed(int(sys.argv[1]))
np.random.random(17)
out = {
    "normal": I.random_normal_initializer(0.0, 1.0, seed=1234).sample((4, 5), np.float64, default_seed=0).tolist(),
    "uniform": I.random_uniform_initializer(-1, 1, seed=99).sample((7,), np.float64, default_seed=0).tolist(),
    "trunc": I.truncated_normal(0.1).sample((3, 3), np.float64, default_seed=I.seed_for("w", 5)).tolist(),
    "glorot": I.glorot_uniform_initializer().sample((6, 4), np.float64, default_seed=I.seed_for("fc", 0)).tolist(),
    "seed_for": I.seed_for("conv1-weight", 0),
}
print(json.dumps(out))
"""


def _run_child(global_seed: int, hash_seed: str) -> dict:
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = hash_seed  # different str hashes in the two processes
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(global_seed)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True,
    )
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_seeded_values_identical_across_processes():
    a = _run_child(1, "1")
    b = _run_child(2, "2")
    assert a == b
    # And the same as in this process: nothing depends on process state.
    here = I.random_normal_initializer(0.0, 1.0, seed=1234).sample((4, 5), F64, default_seed=0)
    assert here.tolist() == a["normal"]
    assert I.seed_for("conv1-weight", 0) == a["seed_for"]


def test_seed_beats_default_seed_and_default_seed_is_used_without_one():
    seeded = I.random_normal_initializer(seed=5)
    a = seeded.sample((10,), F64, default_seed=1)
    b = seeded.sample((10,), F64, default_seed=2)
    np.testing.assert_array_equal(a, b)

    unseeded = I.random_normal_initializer()
    c = unseeded.sample((10,), F64, default_seed=1)
    d = unseeded.sample((10,), F64, default_seed=1)
    e = unseeded.sample((10,), F64, default_seed=2)
    np.testing.assert_array_equal(c, d)
    assert not np.array_equal(c, e)


def test_global_rng_not_used_or_disturbed():
    np.random.seed(0)
    expected = np.random.random(3)
    np.random.seed(0)
    I.random_uniform_initializer(seed=1).sample((100,), F32, default_seed=0)
    I.truncated_normal_initializer().sample((100,), F32, default_seed=3)
    np.testing.assert_array_equal(np.random.random(3), expected)


def test_seed_for_is_stable_63_bit_and_distinguishes_inputs():
    s = I.seed_for("conv1-weight", 0)
    assert s == I.seed_for("conv1-weight", 0)
    assert 0 <= s < 2**63
    seeds = {I.seed_for(n, k) for n in ("a", "b", "a1", "fc-weight") for k in (0, 1, 12)}
    assert len(seeds) == 12
    # Separator: ("a", 12) must not collide with ("a1", 2)-style concatenations.
    assert I.seed_for("2a", 1) != I.seed_for("a", 12)
    # A pinned value catches an accidental change of the derivation, which
    # would silently change every model's default initial weights.
    import hashlib
    digest = hashlib.sha256(b"0\x00conv1-weight").digest()
    assert s == int.from_bytes(digest[:8], "big") & (2**63 - 1)


# ----------------------------------------------------------------- dtypes and layout


@pytest.mark.parametrize(
    "init",
    [
        I.random_uniform_initializer(-2, 3, seed=11),
        I.random_normal_initializer(1.0, 2.0, seed=11),
        I.truncated_normal_initializer(0.5, 0.3, seed=11),
        I.glorot_normal_initializer(),
        I.variance_scaling_initializer(2.0, "fan_in", "truncated_normal", "NCHW"),
    ],
    ids=["uniform", "normal", "truncated", "glorot_normal", "variance_scaling"],
)
def test_float32_and_float64_agree_from_same_seed(init):
    shape = (16, 8, 3, 3)
    x32 = init.sample(shape, F32, default_seed=77)
    x64 = init.sample(shape, F64, default_seed=77)
    assert x32.dtype == F32 and x64.dtype == F64
    assert x32.shape == x64.shape == shape
    assert x32.flags.c_contiguous and x64.flags.c_contiguous
    np.testing.assert_array_equal(x32, x64.astype(np.float32))


def test_dtype_given_as_name_or_flow_like_object():
    class FakeFlowDtype:
        ir_name = "float64"

    init = I.random_normal_initializer(seed=1)
    a = init.sample((3,), "float64", default_seed=0)
    b = init.sample((3,), FakeFlowDtype(), default_seed=0)
    assert a.dtype == b.dtype == F64
    np.testing.assert_array_equal(a, b)
    assert I.random_normal_initializer(dtype=FakeFlowDtype()).dtype == F64


def test_constant_zeros_ones():
    c = I.constant_initializer(3.25).sample((2, 3), F32, default_seed=0)
    assert c.dtype == F32 and c.shape == (2, 3) and (c == 3.25).all()
    z = I.zeros_initializer().sample((4,), np.dtype(np.int32), default_seed=0)
    assert z.dtype == np.int32 and (z == 0).all()
    o = I.ones_initializer(np.float64).sample((2, 2), F64, default_seed=0)
    assert (o == 1).all()
    assert I.constant_initializer().value == 0
    assert I.constant_initializer(7, dtype=np.int32).dtype == np.int32


def test_scalar_and_empty_shapes():
    s = I.random_normal_initializer(seed=0).sample((), F32, default_seed=0)
    assert s.shape == () and s.dtype == F32
    e = I.glorot_uniform_initializer().sample((0, 5), F32, default_seed=0)
    assert e.shape == (0, 5)
    v = I.glorot_uniform_initializer().sample((10,), F32, default_seed=0)
    assert np.abs(v).max() <= math.sqrt(6 / 20)


def test_integer_uniform():
    x = I.random_uniform_initializer(0, 10, dtype=np.int32, seed=2).sample(
        (10000,), np.dtype(np.int32), default_seed=0
    )
    assert x.dtype == np.int32
    assert x.min() == 0 and x.max() == 9
    assert set(np.unique(x)) == set(range(10))


def test_initializers_are_immutable_and_comparable():
    a = I.random_normal_initializer(0.0, 0.5, seed=3)
    with pytest.raises(AttributeError):
        a.stddev = 2.0  # type: ignore[misc]
    assert a == I.random_normal_initializer(0.0, 0.5, seed=3)
    assert a != I.truncated_normal_initializer(0.0, 0.5, seed=3)
    assert hash(a) == hash(I.random_normal_initializer(0.0, 0.5, seed=3))


# ----------------------------------------------------------------- statistics

N = 400_000


def test_uniform_bounds_and_moments():
    x = I.random_uniform_initializer(-3.0, 5.0, seed=4).sample((N,), F64, default_seed=0)
    assert x.min() >= -3.0 and x.max() < 5.0
    assert x.min() < -2.99 and x.max() > 4.99  # actually spans the interval
    assert abs(x.mean() - 1.0) < 0.02
    assert abs(x.std() - 8 / math.sqrt(12)) < 0.02


def test_uniform_float32_stays_below_maxval():
    x = I.random_uniform_initializer(0.0, 1.0, seed=8).sample((N,), F32, default_seed=0)
    assert x.min() >= 0.0 and x.max() < np.float32(1.0)


def test_normal_mean_and_std():
    x = I.random_normal_initializer(2.0, 0.5, seed=6).sample((N,), F64, default_seed=0)
    assert abs(x.mean() - 2.0) < 0.005
    assert abs(x.std() - 0.5) < 0.005
    # Not truncated: about 4.55% of a normal lies beyond 2 sigma.
    assert 0.040 < np.mean(np.abs(x - 2.0) > 1.0) < 0.051


def test_truncated_normal_never_beyond_two_sigma():
    mean, stddev = -1.0, 0.3
    x = I.truncated_normal_initializer(mean, stddev, seed=9).sample((N,), F64, default_seed=0)
    assert np.abs(x - mean).max() <= 2 * stddev
    # Redrawn, not clipped: the band [1.98, 2] sigma holds the truncated density's
    # share, 2 * 0.02 * phi(2) / 0.9545 = 0.23%, not a clipped pile-up of 4.6%.
    assert 0.0015 < np.mean(np.abs(x - mean) > 1.98 * stddev) < 0.003
    # ... and the moments are those of a normal truncated at 2 sigma.
    assert abs(x.mean() - mean) < 0.003
    assert abs(x.std() - 0.87962566 * stddev) < 0.003


def test_truncated_normal_alias_has_mean_zero():
    init = I.truncated_normal(0.1)
    assert isinstance(init, I.TruncatedNormalInitializer)
    assert init.mean == 0.0 and init.stddev == 0.1 and init.seed is None
    x = init.sample((N,), F32, default_seed=1)
    assert np.abs(x).max() <= np.float32(0.2)
    assert abs(float(x.mean())) < 0.001


def test_zero_stddev_gives_the_mean():
    x = I.random_normal_initializer(1.5, 0.0, seed=0).sample((5,), F32, default_seed=0)
    assert (x == 1.5).all()


# ----------------------------------------------------------------- fans, glorot, kaiming


def test_compute_fans_follow_oneflow_layouts():
    assert I.compute_fans((512, 784)) == (784, 512)  # dense: (out, in)
    assert I.compute_fans((32, 1, 5, 5), "NCHW") == (25, 800)  # (out, in, kh, kw)
    assert I.compute_fans((32, 5, 5, 3), "NHWC") == (75, 800)  # (out, kh, kw, in)
    assert I.compute_fans((32, 1, 5, 5), "") == (25, 800)  # "" -> channels first


@pytest.mark.parametrize(
    "shape, data_format, limit",
    [
        ((512, 784), "", math.sqrt(6 / (784 + 512))),
        ((32, 1, 5, 5), "NCHW", math.sqrt(6 / (25 + 800))),
        ((32, 1, 5, 5), "", math.sqrt(6 / (25 + 800))),
        ((32, 5, 5, 1), "NHWC", math.sqrt(6 / (25 + 800))),
    ],
)
def test_glorot_uniform_limit(shape, data_format, limit):
    for factory in (I.glorot_uniform_initializer, I.xavier_uniform_initializer):
        w = factory(data_format).sample(shape, F64, default_seed=21)
        assert w.shape == shape
        assert np.abs(w).max() <= limit
        # The bound is the real one, not merely an upper bound: samples reach near it.
        assert np.abs(w).max() > 0.99 * limit
        assert abs(w.std() - limit / math.sqrt(3)) < 0.05 * limit


def test_glorot_normal_std():
    w = I.xavier_normal_initializer().sample((512, 784), F64, default_seed=3)
    assert abs(w.std() - math.sqrt(2 / (512 + 784))) < 0.01 * math.sqrt(2 / 1296)
    # random_normal, not truncated: some samples lie beyond 2 sigma.
    assert np.abs(w).max() > 2.5 * math.sqrt(2 / 1296)


def test_variance_scaling_truncated_normal_has_target_variance():
    w = I.variance_scaling_initializer(2.0, "fan_in", "truncated_normal").sample(
        (256, 1024), F64, default_seed=4
    )
    target = math.sqrt(2.0 / 1024)
    assert abs(w.std() - target) < 0.01 * target
    assert np.abs(w).max() <= 2 * target / 0.87962566103423978 + 1e-12


def test_variance_scaling_modes():
    shape = (100, 400)
    for mode, fan in (("fan_in", 400), ("fan_out", 100), ("fan_avg", 250)):
        w = I.variance_scaling_initializer(1.0, mode, "random_uniform").sample(
            shape, F64, default_seed=0
        )
        assert np.abs(w).max() <= math.sqrt(3 / fan)
        assert np.abs(w).max() > 0.99 * math.sqrt(3 / fan)


def test_kaiming_default_is_he_normal_fan_in():
    init = I.kaiming_initializer((64, 3, 3, 3))
    assert isinstance(init, I.RandomNormalInitializer)
    assert init.mean == 0.0
    assert math.isclose(init.stddev, math.sqrt(2.0 / 27))


def test_kaiming_variants():
    # fan_out NCHW: 64 * 3 * 3; leaky_relu gain sqrt(2 / (1 + a^2)).
    init = I.kaiming_initializer(
        (64, 3, 3, 3), distribution="random_uniform", mode="fan_out",
        nonlinearity="leaky_relu", negative_slope=0.2,
    )
    std = math.sqrt(2 / 1.04) / math.sqrt(576)
    assert isinstance(init, I.RandomUniformInitializer)
    assert math.isclose(init.maxval, math.sqrt(3) * std)
    assert math.isclose(init.minval, -math.sqrt(3) * std)
    # NHWC fan_in of (out, kh, kw, in) is kh * kw * in.
    nhwc = I.kaiming_initializer((64, 3, 3, 16), nonlinearity="relu", data_format="NHWC")
    assert math.isclose(nhwc.stddev, math.sqrt(2 / 144))
    dense = I.kaiming_initializer((10, 50), nonlinearity="tanh")
    assert math.isclose(dense.stddev, (5 / 3) / math.sqrt(50))
    w = I.kaiming_initializer((256, 512)).sample((256, 512), F64, default_seed=0)
    assert abs(w.std() - math.sqrt(2 / 512)) < 0.01 * math.sqrt(2 / 512)


# ----------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: I.random_normal_initializer(stddev=-1.0), "stddev"),
        (lambda: I.truncated_normal_initializer(stddev=-0.1), "stddev"),
        (lambda: I.truncated_normal(-1.0), "stddev"),
        (lambda: I.random_uniform_initializer(2.0, 1.0), "minval"),
        (lambda: I.random_normal_initializer(seed=-3), "seed"),
        (lambda: I.random_normal_initializer(mean=float("nan")), "mean"),
        (lambda: I.random_normal_initializer(dtype=np.int32), "dtype"),
        (lambda: I.constant_initializer("x"), "value"),
        (lambda: I.variance_scaling_initializer(mode="fan_sum"), "mode"),
        (lambda: I.variance_scaling_initializer(distribution="normal"), "distribution"),
        (lambda: I.variance_scaling_initializer(scale=0.0), "scale"),
        (lambda: I.variance_scaling_initializer(data_format="HWCN"), "data_format"),
        (lambda: I.glorot_uniform_initializer("CHW"), "data_format"),
        (lambda: I.kaiming_initializer((3, 3), mode="fan_avg"), "mode"),
        (lambda: I.kaiming_initializer((3, 3), distribution="truncated_normal"), "distribution"),
        (lambda: I.kaiming_initializer((3, 3), nonlinearity="swish"), "nonlinearity"),
        (lambda: I.kaiming_initializer((3, 3), data_format="NCW?"), "data_format"),
        (lambda: I.kaiming_initializer((9,)), "shape"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(make, argument):
    with pytest.raises(ValueError, match=argument):
        make()


def test_bad_sample_arguments():
    with pytest.raises(ValueError, match="shape"):
        I.random_normal_initializer(seed=0).sample((2, -1), F32, default_seed=0)
    with pytest.raises(ValueError, match="dtype"):
        I.random_normal_initializer(seed=0).sample((2,), np.dtype(np.int32), default_seed=0)
    with pytest.raises(ValueError, match="default_seed"):
        I.random_normal_initializer().sample((2,), F32, default_seed=-1)


def test_equal_bounds_allowed():
    x = I.random_uniform_initializer(1.0, 1.0, seed=0).sample((4,), F32, default_seed=0)
    assert (x == 1.0).all()
