# quick_start (lenet_mnist, OneFlow 0.3): train LeNet in a `type="train"` job whose optimizer is set in the
# job (`flow.optimizer.SGD`), get the loss as a NumPy array at every call, and save the model with
# `flow.checkpoint.save` for lenet_mnist_eval.py and lenet_mnist_predict.py.
import sys

import flow
import flow.typing as tp
from lenet_model import lenet

BATCH = 100
MODEL_DIR = sys.argv[1] if len(sys.argv) > 1 else "./lenet_models_1"


@flow.global_function(type="train")
def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
    with flow.scope.placement("gpu", "0:0"):       # the CPU, with a warning, where there is no GPU
        logits = lenet(images, train=True)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


if __name__ == "__main__":
    (images, labels), _ = flow.data.load_mnist_sample(BATCH, BATCH)
    for step, (x, y) in enumerate(zip(images, labels)):
        loss = train_job(x, y)
        if step % 15 == 0:
            print(f"step {step}: loss {loss.mean():.4f}")
    flow.checkpoint.save(MODEL_DIR)
    print(f"final loss {loss.mean():.4f}; model saved to {MODEL_DIR}")
