# basics_topics / distributed_train: a one-machine training program becomes a distributed one by a few
# configuration calls made before the first job call (devices per machine, the control port, the
# machines); the job function itself does not change.  Launch: mpiexec -n 2 python distributed_train.py
# (2 processes on this one machine: one machine listed, 2 devices on it, one process per device).
import flow
import flow.typing as tp
from run_options import parse

BATCH_SIZE = 100
OPTIONS = parse("an MLP on MNIST, made distributed by configuration only")


def mlp(images):
    init = flow.truncated_normal(0.1)
    flat = flow.reshape(images, [images.shape[0], -1])
    hidden = flow.layers.dense(flat, 512, activation=flow.nn.relu, kernel_initializer=init, name="hidden")
    return flow.layers.dense(hidden, 10, kernel_initializer=init, name="output")


def config_distributed(devices_per_machine):
    print("distributed config")                    # before the first job call: every rank prints it
    flow.config.gpu_device_num(devices_per_machine)
    flow.env.ctrl_port(9988)
    flow.env.machine([{"addr": "127.0.0.1"}])     # the machines of the job: here, this one


@flow.global_function(type="train")
def train_job(images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32)) -> tp.Numpy:
    logits = mlp(images)
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


if __name__ == "__main__":
    config_distributed(OPTIONS.devices)
    flow.config.enable_debug_mode(True)
    flow.train.CheckPoint().init()
    (images, labels), _ = flow.data.load_mnist_sample(BATCH_SIZE, BATCH_SIZE)
    for step, (x, y) in enumerate(zip(images[:OPTIONS.steps], labels[:OPTIONS.steps])):
        loss = train_job(x, y)                      # the loss of all 100 examples, on the master
        if step % OPTIONS.print_every == 0 or step == OPTIONS.steps - 1:
            print(f"step {step} loss {loss.mean():.6f}")
