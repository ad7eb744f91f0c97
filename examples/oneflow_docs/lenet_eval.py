# quick_start: evaluate the LeNet saved by lenet_train.py.  The old-API job returns a dict of Blobs;
# each call's result goes to a callback through .async_get, and the accuracy is summed there.
import sys

import numpy as np

import flow
from lenet_model import lenet

BATCH = 100
MODEL_DIR = sys.argv[1] if len(sys.argv) > 1 else "./lenet_models_1"


def eval_config():
    config = flow.function_config()
    config.default_data_type(flow.float)
    return config


@flow.global_function(eval_config())
def eval_job(images=flow.FixedTensorDef((BATCH, 1, 28, 28), dtype=flow.float),
             labels=flow.FixedTensorDef((BATCH,), dtype=flow.int32)):
    with flow.scope.placement("gpu", "0:0"):
        logits = lenet(images, train=False)
    return {"labels": labels, "logits": logits}


counts = {"seen": 0, "right": 0}


def tally(result):
    predicted = np.argmax(result["logits"].ndarray(), axis=1)
    counts["right"] += int(np.sum(predicted == result["labels"].numpy()))
    counts["seen"] += len(predicted)


if __name__ == "__main__":
    flow.train.CheckPoint().load(MODEL_DIR)
    _, (images, labels) = flow.data.load_mnist_sample(BATCH, BATCH)
    for x, y in zip(images, labels):
        eval_job(x, y).async_get(tally)
    flow.sync_default_session()          # every callback has run: the tally is complete
    print(f"accuracy: {100.0 * counts['right'] / counts['seen']:.1f}%")
