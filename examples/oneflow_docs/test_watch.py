# extended_topics (debugging): flow.watch hands the value of an intermediate blob to a Python function
# at every call, here the output of a relu inside a job that returns nothing.
import numpy as np

import flow
import flow.typing as tp


def show(y):
    print("relu out:", np.array2string(y.ndarray(), precision=3, max_line_width=200))


@flow.global_function()
def relu_job(x: tp.Numpy.Placeholder((10,))):
    y = flow.nn.relu(x)
    flow.watch(y, show)


if __name__ == "__main__":
    flow.config.gpu_device_num(1)
    data = np.random.default_rng(0).uniform(-1, 1, 10).astype(np.float32)
    print("in:", np.array2string(data, precision=3, max_line_width=200))
    relu_job(data)
