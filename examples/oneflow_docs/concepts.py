# basics_topics (concept_explanation): placeholders declare a job's inputs (`oneflow.typing` imported
# as `oft`), a Blob has a shape and dtype while the job is defined, layers are built of ops, and a job's
# logical view is mirrored or consistent (set in its function_config; on one device they compute alike).
import numpy as np

import flow
import flow.typing as oft
from lenet_model import lenet


def view_config(view):
    config = flow.function_config()
    config.default_logical_view(view)
    return config


def make_job(view, name):
    @flow.global_function(type="predict", function_config=view_config(view))
    def test_job(images: oft.Numpy.Placeholder((32, 1, 28, 28), dtype=flow.float32),
                 labels: oft.Numpy.Placeholder((32,), dtype=flow.int32)) -> oft.Numpy:
        logits = lenet(images)
        print(f"{name}: images {images.shape} {images.dtype}, labels {labels.shape} {labels.dtype}, "
              f"logits {logits.shape} {logits.dtype}")
        return flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    return test_job


if __name__ == "__main__":
    mirrored = make_job(flow.scope.mirrored_view(), "mirrored")
    consistent = make_job(flow.scope.consistent_view(), "consistent")
    (images, labels), _ = flow.data.load_mnist_sample(36, 100)
    images, labels = images[:, :32], labels[:, :32]        # the page's batch of 32
    a, b = mirrored(images[0], labels[0]), consistent(images[0], labels[0])
    assert np.allclose(a, b, rtol=1e-5, atol=1e-6)      # both read the same variables (lenet's names)
    print(f"loss {a.mean():.4f} in both views")
