# extended_topics / model_mixed_parallel (hybrid parallelism, OneFlow 0.3's name for the page's
# program): the hidden layer is data parallel, while the output layer's weight is split over the
# devices along axis 0 (`model_distribute=flow.distribute.split(axis=0)`: flowc, like OneFlow, stores
# a dense layer's weight as (units, inputs), so axis 0 splits the output units): model parallelism.
# Launch: mpiexec -n 2 python hybrid_parallelism_mlp.py   (each rank holds and trains 5 of the 10 output
# units; `flowc show --ir --ranks 2` prints the all-gather, all-to-all and reduce-scatter around them)
import flow
import flow.typing as tp
from run_options import parse

OPTIONS = parse("an MLP on MNIST whose output layer is split over the devices (model parallelism)")
BATCH_SIZE = 100


def mlp(images):
    init = flow.truncated_normal(0.1)
    flat = flow.reshape(images, [images.shape[0], -1])
    hidden = flow.layers.dense(flat, 512, activation=flow.nn.relu, kernel_initializer=init, name="dense1")
    return flow.layers.dense(hidden, 10, kernel_initializer=init, name="dense2",
                             model_distribute=flow.distribute.split(axis=0))   # each device: 5 of the 10 units


def train_config():
    config = flow.function_config()
    config.default_data_type(flow.float)
    return config


@flow.global_function(type="train", function_config=train_config())
def train_job(images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32)) -> tp.Numpy:
    logits = mlp(images)
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


if __name__ == "__main__":
    flow.config.gpu_device_num(OPTIONS.devices)
    (images, labels), _ = flow.data.load_mnist_sample(BATCH_SIZE)
    for step, (x, y) in enumerate(zip(images[:OPTIONS.steps], labels[:OPTIONS.steps])):
        loss = train_job(x, y)
        if step % OPTIONS.print_every == 0 or step == OPTIONS.steps - 1:
            print(f"step {step} loss {loss.mean():.6f}")
