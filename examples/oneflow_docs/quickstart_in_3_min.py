# quick_start (quickstart_in_3_min): the three-minute program of OneFlow 0.3 - a two-layer perceptron whose
# weights and biases start uniform in +-1/sqrt(fan_in), trained with Adam through `flow.optimizer`.
# The documentation runs 20 epochs over all of MNIST; EPOCHS passes over the embedded sample do here.
import sys

import numpy as np

import flow
import flow.typing as tp

BATCH = 100
EPOCHS = int(sys.argv[1]) if len(sys.argv) > 1 else 2


@flow.global_function(type="train")
def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
    with flow.scope.placement("cpu", "0:0"):
        flat = flow.reshape(images, [images.shape[0], -1])
        first = flow.random_uniform_initializer(-1 / 28.0, 1 / 28.0)           # 1/sqrt(784)
        hidden = flow.layers.dense(flat, 500, activation=flow.nn.relu, kernel_initializer=first,
                                   bias_initializer=first, name="dense1")
        second = flow.random_uniform_initializer(-np.sqrt(1 / 500.0), np.sqrt(1 / 500.0))
        logits = flow.layers.dense(hidden, 10, kernel_initializer=second, bias_initializer=second,
                                   name="dense2")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [0.001])).minimize(loss)
    return loss


if __name__ == "__main__":
    (images, labels), _ = flow.data.load_mnist_sample(BATCH, BATCH)
    for epoch in range(EPOCHS):
        for step, (x, y) in enumerate(zip(images, labels)):
            loss = train_job(x, y)
            if step % 15 == 0:
                print(f"Epoch [{epoch + 1}/{EPOCHS}], step {step}: loss {loss.mean():.4f}")
    print(f"final loss {loss.mean():.4f}")
