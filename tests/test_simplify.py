"""Constant folding keeps IEEE semantics: an identity it drops must be exact for every input.

`x + 0.0` is not `x` when x is -0.0 (the sum is +0.0), so only `x + (-0.0)` and `x - 0.0` may be
dropped; integers have one zero and drop either.  Each case runs compiled and is compared bit for
bit (sign of zero included) with NumPy.
"""
from __future__ import annotations

import numpy as np
import pytest

import flow
import flow.typing as tp

SPECIAL = np.array([-0.0, 0.0, 1.5, -2.0, np.nan, np.inf, -np.inf, 1e-40], dtype=np.float32)
CASES = {
    "x + 0.0": (lambda x: x + 0.0, lambda x: x + np.float32(0.0)),
    "0.0 + x": (lambda x: 0.0 + x, lambda x: np.float32(0.0) + x),
    "x + -0.0": (lambda x: x + -0.0, lambda x: x + np.float32(-0.0)),
    "x - 0.0": (lambda x: x - 0.0, lambda x: x - np.float32(0.0)),
    "x - -0.0": (lambda x: x - -0.0, lambda x: x - np.float32(-0.0)),
    "x * 1.0": (lambda x: x * 1.0, lambda x: x * np.float32(1.0)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_folded_identities_keep_the_sign_of_zero(case):
    traced, reference = CASES[case]
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((SPECIAL.size,))) -> tp.Numpy:
        return traced(x)

    got = job(SPECIAL)
    want = reference(SPECIAL)
    np.testing.assert_array_equal(got, want)
    assert list(np.signbit(got)) == list(np.signbit(want)), case


def test_integer_zero_is_dropped_either_way():
    from flowc.compiler.passes.simplify import _is_additive_identity
    assert _is_additive_identity(0, "add", "int32") and _is_additive_identity(0, "subtract", "int32")
    assert not _is_additive_identity(0.0, "add", "float32") and _is_additive_identity(-0.0, "add", "float32")
