"""Train the seeds' MLP (784-512-10) on the embedded 5,000-digit MNIST sample; print held-out accuracy.

The model and jobs are the seed programs' ("Get results from job function"), with the
imports changed to `flow`; the data is flowc's embedded sample instead of a download:
4,500 digits to train on, 500 held out.

    python examples/mlp_train_demo.py [--epochs 5]
"""
from __future__ import annotations

import argparse
import time
from typing import Tuple

import numpy as np

import flow
import flow.typing as tp
from flowc.runtime.datasets import load_mnist_sample

BATCH_SIZE = 100


def mlp(data):
    initializer = flow.truncated_normal(0.1)
    reshape = flow.reshape(data, [data.shape[0], -1])
    hidden = flow.layers.dense(
        reshape,
        512,
        activation=flow.nn.relu,
        kernel_initializer=initializer,
        name="hidden",
    )
    return flow.layers.dense(hidden, 10, kernel_initializer=initializer, name="output")


@flow.global_function(type="train")
def train_job(
    images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
    labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32),
) -> tp.Numpy:
    with flow.scope.placement("cpu", "0:0"):
        logits = mlp(images)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
    lr_scheduler = flow.optimizer.PiecewiseConstantScheduler([], [0.1])
    flow.optimizer.SGD(lr_scheduler, momentum=0).minimize(loss)
    return loss


@flow.global_function(type="predict")
def eval_job(
    images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
    labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32),
) -> Tuple[tp.Numpy, tp.Numpy]:
    with flow.scope.placement("cpu", "0:0"):
        logits = mlp(images)
    return (labels, logits)


def train_and_evaluate(epochs: int = 5, verbose: bool = True) -> float:
    """Train for `epochs` over the 4,500 training digits; return accuracy on the 500 held out."""
    (train_images, train_labels), (test_images, test_labels) = load_mnist_sample(BATCH_SIZE, BATCH_SIZE)
    start = time.perf_counter()
    for epoch in range(epochs):
        for i, (images, labels) in enumerate(zip(train_images, train_labels)):
            loss = train_job(images, labels)
            if verbose and i % 20 == 0:
                print(f"epoch {epoch} step {i:3d} loss {loss.mean():.4f}")
    seconds = time.perf_counter() - start
    correct = total = 0
    for images, labels in zip(test_images, test_labels):
        labels_out, logits = eval_job(images, labels)
        correct += int(np.sum(np.argmax(logits, 1) == labels_out))
        total += labels_out.shape[0]
    if verbose:
        steps = epochs * len(train_images)
        print(f"trained {steps} steps in {seconds:.2f} s (first call includes compiling)")
    return correct / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    accuracy = train_and_evaluate(args.epochs)
    print(f"held-out accuracy: {accuracy * 100:.1f}%")


if __name__ == "__main__":
    main()
