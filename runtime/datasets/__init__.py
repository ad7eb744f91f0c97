"""The small MNIST sample embedded in flowc, batched the way OneFlow's examples want it.

`mnist_5k.npz` holds 5,000 MNIST training digits, 500 of each class (`images`
uint8 (5000, 28, 28), `labels` uint8 (5000,)); see ATTRIBUTION.txt.  It is
small enough to ship, so examples and tests can train a real model with no
download.

Example:
    >>> (train_x, train_y), (test_x, test_y) = load_mnist_sample()
    >>> train_x.shape, train_y.shape, test_x.shape
    ((45, 100, 1, 28, 28), (45, 100), (5, 100, 1, 28, 28))
"""
from __future__ import annotations

import functools
import importlib.resources
import operator
from pathlib import Path

import numpy as np

__all__ = ["load_mnist_sample", "MNIST_SAMPLE_PATH"]

MNIST_SAMPLE_PATH = Path(str(importlib.resources.files(__name__).joinpath("mnist_5k.npz")))
_NUM_CLASSES = 10

Batches = tuple[np.ndarray, np.ndarray]


@functools.lru_cache(maxsize=1)
def _raw() -> tuple[np.ndarray, np.ndarray]:
    """The file's images and labels, read once per process and made read-only.

    Read-only because the cached arrays are shared by every call; the arrays
    handed to callers are always fresh copies built from them.
    """
    with np.load(MNIST_SAMPLE_PATH, allow_pickle=False) as data:
        images = np.array(data["images"], dtype=np.uint8)
        labels = np.array(data["labels"], dtype=np.int32)
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _check_batch_size(batch_size: object, n: int, arg: str, part: str) -> int:
    try:
        size = operator.index(batch_size)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ValueError(f"{arg} must be a positive int, got {batch_size!r}") from exc
    if isinstance(batch_size, bool) or size <= 0:
        raise ValueError(f"{arg} must be a positive int, got {batch_size!r}")
    if n % size:
        raise ValueError(
            f"{arg}={size} does not divide the {n} {part} digits; "
            f"batch sizes that would work: {', '.join(map(str, _divisors(n)))}"
        )
    return size


def load_mnist_sample(
    train_batch_size: int = 100,
    test_batch_size: int = 100,
    data_format: str = "NCHW",
    held_out: int = 500,
    seed: int = 0,
) -> tuple[Batches, Batches]:
    """The embedded MNIST sample, split into train and held-out parts, in batches.

    Returns `((train_images, train_labels), (test_images, test_labels))`:
    images float32 in [0, 1] shaped (n_batches, batch, 1, 28, 28) for "NCHW"
    or (n_batches, batch, 28, 28, 1) for "NHWC"; labels int32 (n_batches, batch).

    The split is stratified: `held_out` digits, the same number from each of
    the ten classes (50 each for the default 500), form the test part and the
    other 5000 - held_out the training part.  Which digits are held out is
    fixed (the last held_out/10 of each class in the file), so the test part is
    the same for every `seed` and accuracies compare across seeds; `seed` only
    sets the order of each part, through PCG64, identically on every platform.

    Raises ValueError for a batch size that does not divide its part (the
    message lists the sizes that would), an unknown data_format, or a held_out
    that is not a multiple of 10 in [0, 5000).

    Example:
        >>> (x, y), _ = load_mnist_sample(train_batch_size=50, data_format="NHWC")
        >>> x.shape, x.dtype, y.dtype
        ((90, 50, 28, 28, 1), dtype('float32'), dtype('int32'))
    """
    if data_format not in ("NCHW", "NHWC"):
        raise ValueError(f"data_format must be 'NCHW' or 'NHWC', got {data_format!r}")
    images, labels = _raw()
    total = len(labels)
    try:
        n_held = operator.index(held_out)
    except TypeError as exc:
        raise ValueError(f"held_out must be an int, got {held_out!r}") from exc
    if not (0 <= n_held < total) or n_held % _NUM_CLASSES:
        raise ValueError(
            f"held_out must be a multiple of {_NUM_CLASSES} in [0, {total}) so every class "
            f"gives the same number of digits, got {held_out!r}"
        )
    per_class = n_held // _NUM_CLASSES
    train_size = _check_batch_size(train_batch_size, total - n_held, "train_batch_size", "training")
    test_size = _check_batch_size(test_batch_size, n_held, "test_batch_size", "held-out")

    train_idx: list[np.ndarray] = []
    test_idx: list[np.ndarray] = []
    for digit in range(_NUM_CLASSES):
        members = np.flatnonzero(labels == digit)
        cut = len(members) - per_class
        train_idx.append(members[:cut])
        test_idx.append(members[cut:])

    rng = np.random.Generator(np.random.PCG64(seed))
    train = rng.permutation(np.concatenate(train_idx))
    test = rng.permutation(np.concatenate(test_idx))

    def batches(idx: np.ndarray, batch: int) -> Batches:
        x = images[idx].astype(np.float32) / np.float32(255.0)
        x = x[..., np.newaxis] if data_format == "NHWC" else x[:, np.newaxis]
        x = x.reshape((len(idx) // batch, batch) + x.shape[1:])
        y = labels[idx].reshape(len(idx) // batch, batch)
        return np.ascontiguousarray(x), np.ascontiguousarray(y)

    return batches(train, train_size), batches(test, test_size)
