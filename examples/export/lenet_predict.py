# The LeNet of examples/oneflow_docs as a predict job for `flowc export` (issue 18): train it and save
# a checkpoint, export the predict job as a C library, then call it from C (predict.c) or from C++ on
# several threads (predict_threads.cpp).
#
#   python examples/export/lenet_predict.py lenet_ckpt            # 45 steps of SGD, then flow.checkpoint.save
#   flowc export examples/export/lenet_predict.py:predict_job --checkpoint lenet_ckpt -o lenet_c --prefix lenet
#   cc -O2 examples/export/predict.c -Ilenet_c -Llenet_c -llenet -Wl,-rpath,"$PWD/lenet_c" -o predict
#
# `make_jobs(batch)` builds the predict job for another batch size (the benchmark exports batch 100).
import sys

import flow
import flow.typing as tp

TRAIN_BATCH = 100


def lenet(images, train=False):
    init = flow.truncated_normal(0.1)
    x = flow.layers.conv2d(images, 32, 5, padding="SAME", activation=flow.nn.relu, name="conv1",
                           kernel_initializer=init)
    x = flow.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME", name="pool1", data_format="NCHW")
    x = flow.layers.conv2d(x, 64, 5, padding="SAME", activation=flow.nn.relu, name="conv2",
                           kernel_initializer=init)
    x = flow.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME", name="pool2", data_format="NCHW")
    x = flow.reshape(x, [x.shape[0], -1])
    x = flow.layers.dense(x, 512, activation=flow.nn.relu, kernel_initializer=init, name="dense1")
    return flow.layers.dense(x, 10, kernel_initializer=init, name="dense2")


def make_jobs(batch: int = 1):
    """The predict job on `batch` images (1 by default: what `flowc export MODULE.py:predict_job` builds)."""
    @flow.global_function(type="predict")
    def predict_job(images: tp.Numpy.Placeholder((batch, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
        return lenet(images)
    return predict_job


def train_and_save(path: str, steps: int = 45) -> float:
    """Train LeNet with SGD for `steps` batches of the embedded MNIST sample, save it at `path`; the last loss."""
    @flow.global_function(type="train")
    def train_job(images: tp.Numpy.Placeholder((TRAIN_BATCH, 1, 28, 28), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((TRAIN_BATCH,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, lenet(images, train=True))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    (images, labels), _ = flow.data.load_mnist_sample(TRAIN_BATCH, TRAIN_BATCH)
    loss = None
    for step in range(steps):
        loss = train_job(images[step % len(images)], labels[step % len(labels)])
    flow.checkpoint.save(path)
    return float(loss.mean())


if __name__ == "__main__":
    print(f"final loss {train_and_save(sys.argv[1] if len(sys.argv) > 1 else 'lenet_ckpt'):.4f}")
