# extended_topics / consistent_mirrored, mirrored view: every device runs the job on its own part of
# the batch, handed over as one entry per device of a `tp.ListNumpy`; the result comes back as one
# array per device, and the gradients are averaged over the devices before each update.
# Launch: mpiexec -n 2 python mirrored_strategy.py   (--devices 1: the whole batch in one entry)
import numpy as np

import flow
import flow.typing as tp
from run_options import parse

OPTIONS = parse("an MLP on MNIST in the mirrored view: one batch per device")
BATCH_SIZE = 100
DEVICES = OPTIONS.devices
BATCH_PER_DEVICE = BATCH_SIZE // DEVICES


def train_config():
    config = flow.function_config()
    config.default_data_type(flow.float)
    config.default_logical_view(flow.scope.mirrored_view())
    return config


@flow.global_function(type="train", function_config=train_config())
def train_job(images: tp.ListNumpy.Placeholder((BATCH_PER_DEVICE, 1, 28, 28), dtype=flow.float),
              labels: tp.ListNumpy.Placeholder((BATCH_PER_DEVICE,), dtype=flow.int32)) -> tp.ListNumpy:
    init = flow.truncated_normal(0.1)
    flat = flow.reshape(images, [images.shape[0], -1])
    hidden = flow.layers.dense(flat, 512, activation=flow.nn.relu, kernel_initializer=init, name="dense1")
    logits = flow.layers.dense(hidden, 10, kernel_initializer=init, name="dense2")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


if __name__ == "__main__":
    flow.config.gpu_device_num(DEVICES)
    flow.train.CheckPoint().init()
    (images, labels), _ = flow.data.load_mnist_sample(BATCH_SIZE)
    for step, (x, y) in enumerate(zip(images[:OPTIONS.steps], labels[:OPTIONS.steps])):
        # one slice of the batch per device, in device order
        per_device = train_job(np.split(x, DEVICES), np.split(y, DEVICES))
        whole = np.concatenate(per_device)         # the per-example losses of the whole batch
        if step % OPTIONS.print_every == 0 or step == OPTIONS.steps - 1:
            print(f"step {step} loss {whole.mean():.6f} (devices: {len(per_device)})")
