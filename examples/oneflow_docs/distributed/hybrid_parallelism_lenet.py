# extended_topics / model_mixed_parallel (hybrid parallelism by placement): LeNet whose two dense
# layers are placed on different devices of the machine, "0:0" and "0:1", the rest of the network
# running on all devices.  flowc does not place ops on single devices of a distributed job yet: the
# placements name the device kind only, so on 2 ranks this runs as data parallelism (same results).
# Launch: mpiexec -n 2 python hybrid_parallelism_lenet.py
import flow
import flow.typing as tp
from run_options import parse

OPTIONS = parse("LeNet on MNIST with its dense layers placed on different devices")
BATCH_SIZE = 100


def lenet(images, train=False):
    init = flow.truncated_normal(0.1)
    x = flow.layers.conv2d(images, 32, 5, padding="SAME", activation=flow.nn.relu, kernel_initializer=init,
                           name="conv1")
    x = flow.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME", name="pool1")
    x = flow.layers.conv2d(x, 64, 5, padding="SAME", activation=flow.nn.relu, kernel_initializer=init,
                           name="conv2")
    x = flow.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME", name="pool2")
    x = flow.reshape(x, [x.shape[0], -1])
    with flow.scope.placement("gpu", "0:0"):       # the CPU, with a warning, where there is no GPU
        hidden = flow.layers.dense(x, 512, activation=flow.nn.relu, kernel_initializer=init, name="hidden")
    if train:
        hidden = flow.nn.dropout(hidden, rate=0.5)
    with flow.scope.placement("gpu", "0:1"):
        return flow.layers.dense(hidden, 10, kernel_initializer=init, name="outlayer")


def train_config():
    config = flow.function_config()
    config.default_data_type(flow.float)
    return config


@flow.global_function(type="train", function_config=train_config())
def train_job(images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32)) -> tp.Numpy:
    logits = lenet(images, train=True)
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
