# basics_topics (build_nn_with_op_and_layer): a network of layers (conv2d, dense: ops plus variables) and
# ops (max_pool2d, reshape); while the job is defined its blobs are placeholders whose shape and dtype
# can be printed, and a blob's `+` is the broadcasting add.
import numpy as np

import flow
import flow.typing as tp
from lenet_model import lenet

BATCH = 100
seen = {}


@flow.global_function(type="predict")
def lenet_job(data: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
    conv1 = flow.layers.conv2d(data, 32, 5, padding="SAME", activation=flow.nn.relu, name="probe_conv1")
    print("conv1:", conv1.shape, conv1.dtype)         # runs while the job is traced: a placeholder
    seen["conv1"] = (tuple(conv1.shape), conv1.dtype)
    return lenet(data, train=False)


@flow.global_function(type="predict")
def add_job(output: tp.Numpy.Placeholder((4, 10), dtype=flow.float),
            fc2_biases: tp.Numpy.Placeholder((10,), dtype=flow.float)) -> tp.Numpy:
    overloaded = output + fc2_biases
    return overloaded - flow.math.add(output, fc2_biases)     # the same op: zero


if __name__ == "__main__":
    (images, _), _ = flow.data.load_mnist_sample(BATCH, BATCH)
    logits = lenet_job(images[0])
    assert seen["conv1"] == ((BATCH, 32, 28, 28), flow.float32)
    print("logits:", logits.shape, logits.dtype)
    rng = np.random.default_rng(0)
    difference = add_job(rng.standard_normal((4, 10)).astype(np.float32), rng.standard_normal(10).astype(np.float32))
    assert not difference.any()
    print("output + fc2_biases == flow.math.add(output, fc2_biases)")
