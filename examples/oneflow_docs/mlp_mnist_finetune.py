# basics_topics (model load and save): load the perceptron saved by mlp_mnist_origin.py into a model with
# one more layer ("dense3", not in the checkpoint, so initialized) and train on.
import sys

import flow
import flow.typing as tp

BATCH = 100
MODEL_DIR = sys.argv[1] if len(sys.argv) > 1 else "./mlp_models_1"
OUT_DIR = sys.argv[2] if len(sys.argv) > 2 else "./mlp_ext_models_1"


@flow.global_function(type="train")
def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
    with flow.scope.placement("cpu", "0:0"):
        init = flow.truncated_normal(0.1)
        flat = flow.reshape(images, [images.shape[0], -1])
        hidden = flow.layers.dense(flat, 512, activation=flow.nn.relu, kernel_initializer=init, name="dense1")
        dense2 = flow.layers.dense(hidden, 10, kernel_initializer=init, name="dense2")
        dense3 = flow.layers.dense(dense2, 10, kernel_initializer=init, name="dense3")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, dense3)
    schedule = flow.optimizer.PiecewiseConstantScheduler([], [0.1])
    flow.optimizer.SGD(schedule, momentum=0).minimize(loss)
    return loss


if __name__ == "__main__":
    checkpoint = flow.train.CheckPoint()
    checkpoint.load(MODEL_DIR)
    (images, labels), _ = flow.data.load_mnist_sample(BATCH, BATCH)
    for step, (x, y) in enumerate(zip(images, labels)):
        loss = train_job(x, y)
        if step % 15 == 0:
            print(f"step {step}: loss {loss.mean():.4f}")
    checkpoint.save(OUT_DIR)
    print(f"final loss {loss.mean():.4f}; model saved to {OUT_DIR}")
