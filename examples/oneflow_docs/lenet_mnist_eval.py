# quick_start (lenet_mnist, OneFlow 0.3): load the LeNet saved by lenet_mnist_train.py with
# `flow.load_variables(flow.checkpoint.get(...))` and measure its accuracy on held-out digits with a
# `type="predict"` job returning a Tuple of two NumPy arrays.
import sys
from typing import Tuple

import numpy as np

import flow
import flow.typing as tp
from lenet_model import lenet

BATCH = 100
MODEL_DIR = sys.argv[1] if len(sys.argv) > 1 else "./lenet_models_1"


@flow.global_function(type="predict")
def eval_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
             labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> Tuple[tp.Numpy, tp.Numpy]:
    with flow.scope.placement("gpu", "0:0"):
        logits = lenet(images, train=False)
        flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")  # unused, as on the page
    return (labels, logits)


totals = {"seen": 0, "right": 0}


def acc(labels, logits):
    totals["right"] += int(np.sum(np.argmax(logits, 1) == labels))
    totals["seen"] += labels.shape[0]


if __name__ == "__main__":
    flow.load_variables(flow.checkpoint.get(MODEL_DIR))
    _, (images, labels) = flow.data.load_mnist_sample(BATCH, BATCH)
    for x, y in zip(images, labels):
        got_labels, logits = eval_job(x, y)
        acc(got_labels, logits)
    print(f"accuracy: {100.0 * totals['right'] / totals['seen']:.1f}%")
