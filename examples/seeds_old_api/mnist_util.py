"""The `mnist_util.load_data` helper the old seed programs import, pointed at flowc's embedded
5,000-digit MNIST sample (4,500 to train on, 500 held out) so the programs run offline."""
from __future__ import annotations

import flow


def load_data(train_batch_size: int = 100, test_batch_size: int = 100):
    """((train_images, train_labels), (test_images, test_labels)), batched, as load_mnist returns."""
    return flow.data.load_mnist_sample(train_batch_size, test_batch_size)
