# quick_start: predict the digit of one image with the LeNet saved by lenet_train.py.  The
# documentation reads a PNG file; this program takes a held-out digit of the embedded sample instead.
import sys

import numpy as np

import flow
from lenet_model import lenet

MODEL_DIR = sys.argv[1] if len(sys.argv) > 1 else "./lenet_models_1"


@flow.global_function(flow.function_config())
def predict_job(images=flow.FixedTensorDef((1, 1, 28, 28), dtype=flow.float),
                labels=flow.FixedTensorDef((1,), dtype=flow.int32)):
    with flow.scope.placement("gpu", "0:0"):
        return lenet(images, train=False)


if __name__ == "__main__":
    flow.train.CheckPoint().load(MODEL_DIR)
    _, (images, labels) = flow.data.load_mnist_sample(1, 1)
    right = 0
    for image, label in zip(images[:20], labels[:20]):
        logits = predict_job(image, np.zeros((1,), np.int32)).get()
        digit = int(np.argmax(logits.ndarray(), axis=1)[0])
        right += digit == int(label[0])
    print(f"predict: {digit} (label {int(label[0])}); {right} of 20 right")
