"""OneFlow's `flow.data` MNIST loaders.

`load_mnist` is OneFlow 0.3's: the full set, downloaded once into `out_dir` (or read from
`mnist.npz` or the four original idx files already there); see runtime/datasets/mnist.py for
where it looks and how it downloads.  `load_mnist_sample` needs no network: 5,000 digits
shipped with flowc.

Example:
    import flow
    (train_images, train_labels), (test_images, test_labels) = flow.data.load_mnist(100, 100)
    (train_images, train_labels), _ = flow.data.load_mnist_sample(100, 100)   # offline

OneFlow's OFRecord readers and decoders (`ofrecord_reader`, `OFRecordRawDecoder`, ...) are bound to
functions that raise `flow.UnsupportedError` naming them (flow/unsupported.py).
"""
from flow import unsupported as _unsupported
from flowc.runtime.datasets import load_mnist_sample
from flowc.runtime.datasets.mnist import load_mnist

globals().update(_unsupported.stubs("data"))
__all__ = ["load_mnist", "load_mnist_sample", *_unsupported.stubs("data")]
