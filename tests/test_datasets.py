"""Tests of runtime.datasets.load_mnist_sample: layout, split, reproducibility, errors."""
from __future__ import annotations

import numpy as np
import pytest

from flowc.runtime.datasets import MNIST_SAMPLE_PATH, load_mnist_sample


@pytest.fixture(scope="module")
def default_split():
    return load_mnist_sample()


def _rows(images: np.ndarray) -> set[bytes]:
    """Each digit's pixels as bytes, to compare digits across parts and layouts."""
    flat = images.reshape(-1, 28 * 28)
    return {row.tobytes() for row in flat}


def test_file_is_the_shipped_sample():
    with np.load(MNIST_SAMPLE_PATH, allow_pickle=False) as data:
        assert data["images"].shape == (5000, 28, 28)
        assert data["images"].dtype == np.uint8
        assert np.bincount(data["labels"], minlength=10).tolist() == [500] * 10
    assert (MNIST_SAMPLE_PATH.parent / "ATTRIBUTION.txt").read_text().startswith("5,000 MNIST")


def test_default_shapes_and_dtypes(default_split):
    (train_x, train_y), (test_x, test_y) = default_split
    assert train_x.shape == (45, 100, 1, 28, 28)
    assert train_y.shape == (45, 100)
    assert test_x.shape == (5, 100, 1, 28, 28)
    assert test_y.shape == (5, 100)
    assert train_x.dtype == test_x.dtype == np.float32
    assert train_y.dtype == test_y.dtype == np.int32
    for a in (train_x, train_y, test_x, test_y):
        assert a.flags.c_contiguous


def test_value_ranges(default_split):
    (train_x, train_y), (test_x, test_y) = default_split
    for x in (train_x, test_x):
        assert x.min() == 0.0 and x.max() == 1.0
        # Scaled by 1/255: every value times 255 is (close to) an integer.
        scaled = x * 255
        assert np.abs(scaled - np.round(scaled)).max() < 1e-3
        # Digits, not noise: most pixels are background.
        assert 0.05 < x.mean() < 0.25
    for y in (train_y, test_y):
        assert y.min() == 0 and y.max() == 9


def test_stratified_split(default_split):
    (_, train_y), (_, test_y) = default_split
    assert np.bincount(test_y.ravel(), minlength=10).tolist() == [50] * 10
    assert np.bincount(train_y.ravel(), minlength=10).tolist() == [450] * 10


def test_train_and_held_out_are_disjoint_and_cover_the_sample(default_split):
    (train_x, _), (test_x, _) = default_split
    train_rows, test_rows = _rows(train_x), _rows(test_x)
    assert not train_rows & test_rows
    with np.load(MNIST_SAMPLE_PATH, allow_pickle=False) as data:
        all_rows = _rows(data["images"].astype(np.float32) / np.float32(255))
    assert train_rows | test_rows == all_rows


def test_labels_stay_with_their_images(default_split):
    (train_x, train_y), _ = default_split
    with np.load(MNIST_SAMPLE_PATH, allow_pickle=False) as data:
        lookup = {
            row.tobytes(): int(lab)
            for row, lab in zip(
                (data["images"].astype(np.float32) / np.float32(255)).reshape(-1, 784),
                data["labels"],
            )
        }
    x = train_x.reshape(-1, 784)
    y = train_y.ravel()
    for i in range(0, len(y), 97):
        assert lookup[x[i].tobytes()] == y[i]


def test_shuffled_and_reproducible(default_split):
    (train_x, train_y), (test_x, test_y) = default_split
    (again_x, again_y), _ = load_mnist_sample()
    np.testing.assert_array_equal(train_x, again_x)
    np.testing.assert_array_equal(train_y, again_y)
    # Shuffled: the first batch mixes classes rather than being all zeros.
    assert len(np.unique(train_y[0])) >= 8
    assert len(np.unique(test_y[0])) >= 8
    # Another seed: another order, same held-out digits.
    (other_x, other_y), (other_tx, _) = load_mnist_sample(seed=1)
    assert not np.array_equal(other_y, train_y)
    assert _rows(other_x) == _rows(train_x)
    assert _rows(other_tx) == _rows(test_x)


def test_nhwc_layout(default_split):
    (train_x, train_y), (test_x, _) = default_split
    (nx, ny), (ntx, _) = load_mnist_sample(data_format="NHWC")
    assert nx.shape == (45, 100, 28, 28, 1)
    assert ntx.shape == (5, 100, 28, 28, 1)
    np.testing.assert_array_equal(nx[..., 0], train_x[:, :, 0])
    np.testing.assert_array_equal(ny, train_y)


def test_other_batch_sizes_and_held_out():
    (train_x, train_y), (test_x, test_y) = load_mnist_sample(
        train_batch_size=32, test_batch_size=40, held_out=1000
    )
    assert train_x.shape == (125, 32, 1, 28, 28)
    assert test_x.shape == (25, 40, 1, 28, 28)
    assert np.bincount(test_y.ravel(), minlength=10).tolist() == [100] * 10


def test_indivisible_batch_size_error_lists_divisors():
    with pytest.raises(ValueError) as info:
        load_mnist_sample(train_batch_size=7)
    message = str(info.value)
    assert "train_batch_size=7" in message and "4500" in message
    assert ", 90, " in message and ", 100, " in message and ", 7," not in message
    with pytest.raises(ValueError, match="test_batch_size=300.*500"):
        load_mnist_sample(test_batch_size=300)


@pytest.mark.parametrize("bad", ["NWHC", "nchw", "", None])
def test_bad_data_format(bad):
    with pytest.raises(ValueError, match="data_format"):
        load_mnist_sample(data_format=bad)


@pytest.mark.parametrize("kwargs, argument", [
    ({"held_out": 55}, "held_out"),
    ({"held_out": -10}, "held_out"),
    ({"held_out": 5000}, "held_out"),
    ({"train_batch_size": 0}, "train_batch_size"),
    ({"test_batch_size": 2.5}, "test_batch_size"),
])
def test_other_bad_arguments(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        load_mnist_sample(**kwargs)


def test_callers_cannot_corrupt_the_cache():
    (train_x, _), _ = load_mnist_sample()
    train_x[...] = -1.0
    (fresh_x, _), _ = load_mnist_sample()
    assert fresh_x.min() == 0.0
