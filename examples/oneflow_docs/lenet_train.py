# quick_start: train LeNet with the old API (the loss marked with flow.losses.add_loss, the update rule
# in the function_config) and save the model for lenet_eval.py and lenet_test.py.
import sys

import flow
import flow.typing as tp
from lenet_model import lenet

BATCH = 100
MODEL_DIR = sys.argv[1] if len(sys.argv) > 1 else "./lenet_models_1"


def train_config():
    config = flow.function_config()
    config.default_data_type(flow.float)
    config.train.primary_lr(0.1)
    config.train.model_update_conf({"naive_conf": {}})
    return config


@flow.global_function(train_config())
def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)):
    with flow.scope.placement("gpu", "0:0"):       # runs on the CPU, with a warning, where there is no GPU
        logits = lenet(images, train=True)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
    flow.losses.add_loss(loss)
    return loss


if __name__ == "__main__":
    flow.config.gpu_device_num(1)
    checkpoint = flow.train.CheckPoint()
    checkpoint.init()
    (images, labels), _ = flow.data.load_mnist_sample(BATCH)
    for step, (x, y) in enumerate(zip(images, labels)):
        mean_loss = train_job(x, y).get().mean()
        if step % 15 == 0:
            print(f"step {step}: loss {mean_loss:.4f}")
    checkpoint.save(MODEL_DIR)
    print(f"final loss {mean_loss:.4f}; model saved to {MODEL_DIR}")
