# extended_topics / model_mixed_parallel (mixed parallelism, the page's older name): the same network
# as hybrid_parallelism_mlp.py, with its model-parallel output layer spelled out on the variables:
# `flow.get_variable(..., distribute=flow.distribute.split(0))` holds each device's rows of the
# weight (output units), the bias the same way; the hidden layer stays data parallel.
# Launch: mpiexec -n 2 python mixed_parallel_mlp.py
import flow
import flow.typing as tp
from run_options import parse

OPTIONS = parse("an MLP on MNIST whose output layer's variables are split over the devices")
BATCH_SIZE = 100


def split_dense(x, units, name):
    """x @ weightᵀ + bias, the weight (units, inputs) and the bias split by output unit over the devices."""
    weight = flow.get_variable(f"{name}-weight", shape=(units, x.shape[1]), dtype=flow.float,
                               initializer=flow.truncated_normal(0.1), distribute=flow.distribute.split(0))
    bias = flow.get_variable(f"{name}-bias", shape=(units,), dtype=flow.float,
                             initializer=flow.zeros_initializer(), distribute=flow.distribute.split(0))
    return flow.nn.bias_add(flow.matmul(x, weight, transpose_b=True), bias)


def mlp(images):
    init = flow.truncated_normal(0.1)
    flat = flow.reshape(images, [images.shape[0], -1])
    hidden = flow.layers.dense(flat, 512, activation=flow.nn.relu, kernel_initializer=init, name="dense1")
    return split_dense(hidden, 10, "dense2")


@flow.global_function(type="train")
def train_job(images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32)) -> tp.Numpy:
    logits = mlp(images)
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


if __name__ == "__main__":
    flow.config.gpu_device_num(OPTIONS.devices)
    flow.train.CheckPoint().init()
    (images, labels), _ = flow.data.load_mnist_sample(BATCH_SIZE)
    for step, (x, y) in enumerate(zip(images[:OPTIONS.steps], labels[:OPTIONS.steps])):
        loss = train_job(x, y)
        if step % OPTIONS.print_every == 0 or step == OPTIONS.steps - 1:
            print(f"step {step} loss {loss.mean():.6f}")
