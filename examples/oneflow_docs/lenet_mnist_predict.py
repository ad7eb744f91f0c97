# quick_start (lenet_mnist, OneFlow 0.3): recognise single digits with the LeNet saved by
# lenet_mnist_train.py - a `type="predict"` job on a batch of one, the model loaded with
# `flow.load_variables(flow.checkpoint.get(...))`.  The page reads a PNG file and scales it to
# (pixel - 128) / 255; here held-out digits of the embedded sample (already in [0, 1]) stand in for it.
import sys

import numpy as np

import flow
import flow.typing as tp
from lenet_model import lenet

MODEL_DIR = sys.argv[1] if len(sys.argv) > 1 else "./lenet_models_1"


@flow.global_function(type="predict")
def eval_job(images: tp.Numpy.Placeholder((1, 1, 28, 28), dtype=flow.float),
             labels: tp.Numpy.Placeholder((1,), dtype=flow.int32)) -> tp.Numpy:
    with flow.scope.placement("gpu", "0:0"):
        return lenet(images, train=False)


if __name__ == "__main__":
    flow.load_variables(flow.checkpoint.get(MODEL_DIR))
    _, (images, labels) = flow.data.load_mnist_sample(1, 1)
    right = 0
    for image, label in zip(images[:20], labels[:20]):
        logits = eval_job(image, np.zeros((1,)).astype(np.int32))
        prediction = np.argmax(logits, 1)
        right += int(prediction[0]) == int(label[0])
    print(f"prediction: {prediction[0]} (label {int(label[0])}); {right} of 20 right")
