# basics_topics (model_load_save, OneFlow 0.3): the page's snippets, one after another -
#   a layer built on flow.get_variable (the way layers.conv2d makes its weight), the initializers listed,
#   flow.get_all_variables() read between calls, flow.load_variables() from a dict of arrays,
#   flow.checkpoint.save(path) / flow.checkpoint.save(path, var_dict) and the saved folder's structure,
#   and flow.load_variables(flow.checkpoint.get(path)).
import os
import sys

import numpy as np

import flow
import flow.typing as tp

WORK_DIR = sys.argv[1] if len(sys.argv) > 1 else "."
INITIALIZERS = {
    "constant": flow.constant_initializer(0.5), "zeros": flow.zeros_initializer(),
    "ones": flow.ones_initializer(), "random_uniform": flow.random_uniform_initializer(),
    "random_normal": flow.random_normal_initializer(), "truncated_normal": flow.truncated_normal_initializer(),
    "glorot_uniform": flow.glorot_uniform_initializer(), "glorot_normal": flow.glorot_normal_initializer(),
    "variance_scaling": flow.variance_scaling_initializer(), "xavier_normal": flow.xavier_normal_initializer(),
    "xavier_uniform": flow.xavier_uniform_initializer(),
    "kaiming": flow.kaiming_initializer((4, 3, 3, 3), nonlinearity="relu"),
}


def conv2d_layer(inputs, filters, kernel_size, name, kernel_initializer=None):
    """A convolution layer made the way the page shows flow.layers.conv2d making its weight."""
    weight = flow.get_variable(
        name + "-weight",
        shape=(filters, inputs.shape[1], kernel_size, kernel_size),
        dtype=inputs.dtype,
        initializer=kernel_initializer if kernel_initializer is not None else flow.constant_initializer(0),
        trainable=True,
        model_name="weight",
    )
    return flow.nn.conv2d(inputs, weight, 1, "SAME", "NCHW", None, groups=1, name=name)


@flow.global_function(type="train")
def train_job(images: tp.Numpy.Placeholder((8, 3, 6, 6), dtype=flow.float)) -> tp.Numpy:
    with flow.scope.placement("cpu", "0:0"):
        features = conv2d_layer(images, 4, 3, "conv1", kernel_initializer=INITIALIZERS["kaiming"])
        myblob = flow.get_variable("myblob", shape=(3, 3), initializer=flow.random_normal_initializer())
        loss = flow.math.reduce_mean(flow.math.square(features)) + flow.math.reduce_sum(myblob * myblob)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.05]), momentum=0).minimize(loss)
    return loss


@flow.global_function(type="predict")
def init_job() -> tp.Numpy:
    values = [flow.get_variable(f"init_{kind}", shape=(4, 3, 3, 3), initializer=init)
              for kind, init in INITIALIZERS.items()]
    return flow.stack([flow.math.reduce_mean(v) for v in values], axis=0)


@flow.global_function(type="predict")
def job() -> tp.Numpy:
    myblob = flow.get_variable("myblob", shape=(3, 3), initializer=flow.random_normal_initializer())
    return myblob


if __name__ == "__main__":
    means = init_job()
    print("initializer means:", " ".join(f"{k}={m.item():.3f}" for k, m in zip(INITIALIZERS, means)))

    images = np.random.default_rng(0).standard_normal((8, 3, 6, 6)).astype(np.float32)
    norms = []
    for step in range(3):
        train_job(images)
        all_variables = flow.get_all_variables()
        norms.append(float(np.linalg.norm(all_variables["myblob"].numpy())))
        print(f"step {step}: |myblob| {norms[-1]:.4f}")
    assert norms[2] < norms[1] < norms[0], "training shrinks myblob"

    flow.load_variables({"myblob": np.ones((3, 3)).astype(np.float32)})
    print("after load_variables:", flow.get_all_variables()["myblob"].numpy().tolist())
    assert np.array_equal(job(), np.ones((3, 3), np.float32))

    everything = os.path.join(WORK_DIR, "models_all")
    flow.checkpoint.save(everything)
    print("saved:", " ".join(sorted(os.listdir(everything))))
    only_conv = os.path.join(WORK_DIR, "models_conv1")
    flow.checkpoint.save(only_conv, {"conv1-weight": flow.get_all_variables()["conv1-weight"]})
    print("saved with var_dict:", " ".join(sorted(os.listdir(only_conv))))
    try:
        flow.checkpoint.save(everything)
    except Exception as error:            # an existing, non-empty folder is never overwritten
        print("saving again fails:", type(error).__name__)

    flow.load_variables({"myblob": np.zeros((3, 3), np.float32)})
    flow.load_variables(flow.checkpoint.get(everything))
    assert np.array_equal(job(), np.ones((3, 3), np.float32))
    print("reloaded myblob:", job().tolist())
