# basics_topics (data input): feed NumPy arrays to a job and get them back as a tuple of arrays.
from typing import Tuple

import numpy as np

import flow
import flow.typing as tp


@flow.global_function(type="predict")
def echo_job(images: tp.Numpy.Placeholder((32, 1, 28, 28), dtype=flow.float),
             labels: tp.Numpy.Placeholder((32,), dtype=flow.int32)) -> Tuple[tp.Numpy, tp.Numpy]:
    return images, labels


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    images_in = rng.uniform(-10, 10, (32, 1, 28, 28)).astype(np.float32)
    labels_in = rng.integers(-10, 10, (32,)).astype(np.int32)
    images, labels = echo_job(images_in, labels_in)
    assert np.array_equal(images, images_in) and np.array_equal(labels, labels_in)
    print(images.shape, labels.shape)
