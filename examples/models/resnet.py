"""ResNet-50 v1.5 and ResNet-18 image classification on synthetic data, in OneFlow-Benchmark's style.

The network is written against `flow` the way OneFlow-Benchmark's Classification/cnns scripts write
theirs, so its variables carry the same names (`Resnet-conv1-weight`, `Resnet-conv1_bn-gamma`,
`Resnet-res2_0_branch2a-weight`, `Resnet-res3_0_branch1_bn-moving_mean`, `Resnet-fc1001-weight`, ...):

* stem: 7x7 stride-2 convolution, batch norm, relu, 3x3 stride-2 max pool with "SAME" padding;
* four stages of residual blocks (`resN_i`): bottleneck blocks for ResNet-50 (1x1 -> 3x3 -> 1x1, the
  stride on the 3x3 as in v1.5), basic blocks (3x3 -> 3x3) for ResNet-18; a projection shortcut
  (`_branch1`, 1x1 convolution + batch norm) where the stride or the width changes; the last batch
  norm of each residual branch starts with gamma = 0, so every block starts as the identity;
* a global average pool (an `avg_pool2d` over the whole feature map) and the `fc1001` dense layer;
* NCHW or NHWC throughout (`data_format`): conv weights are (out, in, kh, kw) or (out, kh, kw, in);
* the train job: softmax cross-entropy against one-hot labels smoothed by 0.1 (OneFlow-Benchmark's
  default `--label_smoothing`), L2 weight decay 1/32768 through the variables' regularizers, momentum
  SGD (0.875) with cosine decay after a linear warmup.

    python examples/models/resnet.py --config resnet18 --steps 20
    python examples/models/resnet.py --config resnet50 --steps 3 --batch-size 4 --data-format NHWC
"""
# (no `from __future__ import annotations`: the job functions' placeholder annotations are local names)
import os
import sys
from dataclasses import dataclass, replace
from typing import Callable, Tuple

import numpy as np

import flow
import flow.typing as tp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from progress import parse_args, train_loop  # noqa: E402


@dataclass(frozen=True)
class ResNetConfig:
    """The shape of one ResNet, and the batch its jobs are compiled for."""
    block: str                           # "bottleneck" (ResNet-50) or "basic" (ResNet-18)
    block_counts: Tuple[int, ...]        # residual blocks per stage
    block_filters: Tuple[int, ...]       # output channels of each stage
    block_filters_inner: Tuple[int, ...]  # bottleneck width of each stage (basic blocks: unused)
    stem_filters: int
    image_size: int
    batch_size: int
    num_classes: int = 1000
    data_format: str = "NCHW"
    label_smoothing: float = 0.1
    weight_decay: float = 1.0 / 32768
    learning_rate: float = 0.256
    momentum: float = 0.875


CONFIGS = {
    # For the tests: every kind of layer (bottleneck blocks, projection and identity shortcuts, strided
    # 1x1 and 3x3 convolutions), few channels, 32x32 images.
    "tiny": ResNetConfig(block="bottleneck", block_counts=(2, 1, 1, 1), block_filters=(16, 16, 24, 32),
                         block_filters_inner=(4, 8, 8, 8), stem_filters=8, image_size=32, batch_size=4,
                         num_classes=10, learning_rate=0.05),
    "tiny18": ResNetConfig(block="basic", block_counts=(1, 1, 1, 1), block_filters=(8, 16, 16, 32),
                           block_filters_inner=(8, 16, 16, 32), stem_filters=8, image_size=32, batch_size=4,
                           num_classes=10, learning_rate=0.05),
    "resnet18": ResNetConfig(block="basic", block_counts=(2, 2, 2, 2), block_filters=(64, 128, 256, 512),
                             block_filters_inner=(64, 128, 256, 512), stem_filters=64, image_size=32,
                             batch_size=32, num_classes=10, learning_rate=0.1),
    "resnet50": ResNetConfig(block="bottleneck", block_counts=(3, 4, 6, 3), block_filters=(256, 512, 1024, 2048),
                             block_filters_inner=(64, 128, 256, 512), stem_filters=64, image_size=224,
                             batch_size=16),
}


def channels_last(config: ResNetConfig) -> bool:
    return config.data_format in ("NHWC", "channels_last")


def image_shape(config: ResNetConfig) -> Tuple[int, int, int, int]:
    """The (B, C, H, W) or (B, H, W, C) shape of a batch of images."""
    b, s = config.batch_size, config.image_size
    return (b, s, s, 3) if channels_last(config) else (b, 3, s, s)


# --------------------------------------------------------------------------------------------- layers

class ResNetBuilder:
    """The layers of one ResNet job: convolutions without bias followed by batch norm, as in
    OneFlow-Benchmark's ResnetBuilder (the names of its variables are OneFlow-Benchmark's)."""

    def __init__(self, config: ResNetConfig, training: bool) -> None:
        self.config, self.training = config, training
        self.data_format = "NHWC" if channels_last(config) else "NCHW"
        # He initialisation with the fan-in read from the weight layout of this data format.
        self.weight_initializer = flow.variance_scaling_initializer(2.0, "fan_in", "random_normal",
                                                                    data_format=self.data_format)
        wd = config.weight_decay
        self.regularizer = flow.regularizers.l2(wd) if 0.0 < wd < 1.0 else None

    def channels(self, x) -> int:
        return x.shape[3] if self.data_format == "NHWC" else x.shape[1]

    def conv2d(self, x, name: str, filters: int, kernel_size: int, strides: int):
        shape = ((filters, kernel_size, kernel_size, self.channels(x)) if self.data_format == "NHWC"
                 else (filters, self.channels(x), kernel_size, kernel_size))
        weight = flow.get_variable(name + "-weight", shape=shape, dtype=x.dtype, initializer=self.weight_initializer,
                                   regularizer=self.regularizer, model_name="weight")
        # "SAME" pads the 3x3 and 7x7 convolutions and the strided 1x1 ones; a 1x1 stride-1 one needs none.
        padding = "SAME" if strides > 1 or kernel_size > 1 else "VALID"
        return flow.nn.conv2d(x, weight, strides, padding, self.data_format, name=name)

    def batch_norm(self, x, name: str, last: bool = False):
        return flow.layers.batch_normalization(
            x, axis=3 if self.data_format == "NHWC" else 1, momentum=0.9, epsilon=1e-5,
            gamma_initializer=flow.zeros_initializer() if last else flow.ones_initializer(),
            gamma_regularizer=self.regularizer, beta_regularizer=self.regularizer, training=self.training,
            name=name)

    def conv_bn(self, x, name: str, filters: int, kernel_size: int, strides: int, relu: bool, last: bool = False):
        """conv -> batch norm (`<name>_bn`) -> optional relu: OneFlow-Benchmark's conv2d_affine."""
        out = self.batch_norm(self.conv2d(x, name, filters, kernel_size, strides), name + "_bn", last)
        return flow.nn.relu(out) if relu else out

    def residual_branch(self, x, block: str, filters: int, inner: int, strides: int):
        if self.config.block == "bottleneck":     # v1.5: the stride sits on the 3x3, not on the first 1x1
            a = self.conv_bn(x, block + "_branch2a", inner, 1, 1, relu=True)
            b = self.conv_bn(a, block + "_branch2b", inner, 3, strides, relu=True)
            return self.conv_bn(b, block + "_branch2c", filters, 1, 1, relu=False, last=True)
        a = self.conv_bn(x, block + "_branch2a", filters, 3, strides, relu=True)
        return self.conv_bn(a, block + "_branch2b", filters, 3, 1, relu=False, last=True)

    def residual_block(self, x, block: str, filters: int, inner: int, strides: int):
        shortcut = x
        if strides != 1 or self.channels(x) != filters:
            shortcut = self.conv_bn(x, block + "_branch1", filters, 1, strides, relu=False)
        return flow.nn.relu(self.residual_branch(x, block, filters, inner, strides) + shortcut)

    def body(self, x):
        c = self.config
        for i, (count, filters, inner) in enumerate(zip(c.block_counts, c.block_filters, c.block_filters_inner)):
            for j in range(count):
                strides = 2 if i > 0 and j == 0 else 1
                x = self.residual_block(x, f"res{i + 2}_{j}", filters, inner, strides)
        return x

    def stem(self, images):
        conv1 = self.conv_bn(images, "conv1", self.config.stem_filters, 7, 2, relu=True)
        return flow.nn.max_pool2d(conv1, ksize=3, strides=2, padding="SAME", data_format=self.data_format,
                                  name="pool1")


def resnet(images, config: ResNetConfig, training: bool):
    """(B, num_classes) logits of `images` (in the config's data format)."""
    builder = ResNetBuilder(config, training)
    with flow.scope.namespace("Resnet"):
        body = builder.body(builder.stem(images))
        hw = body.shape[1:3] if builder.data_format == "NHWC" else body.shape[2:4]
        pool5 = flow.nn.avg_pool2d(body, ksize=tuple(hw), strides=1, padding="VALID",      # global average pool
                                   data_format=builder.data_format, name="pool5")
        return flow.layers.dense(flow.reshape(pool5, (pool5.shape[0], -1)), units=config.num_classes,
                                 kernel_initializer=flow.variance_scaling_initializer(2.0, "fan_in", "random_normal"),
                                 bias_initializer=flow.zeros_initializer(), kernel_regularizer=builder.regularizer,
                                 bias_regularizer=builder.regularizer, name="fc1001")


def smoothed_labels(labels, config: ResNetConfig):
    """One-hot labels with `label_smoothing` eta spread over the classes: 1 - eta + eta/K and eta/K."""
    eta, k = config.label_smoothing, config.num_classes
    return flow.one_hot(labels, depth=k, dtype=flow.float, on_value=1.0 - eta + eta / k, off_value=eta / k)


def classification_loss(logits, labels, config: ResNetConfig):
    """The batch's mean softmax cross-entropy, against smoothed labels when `label_smoothing` > 0."""
    if config.label_smoothing > 0:
        loss = flow.nn.softmax_cross_entropy_with_logits(smoothed_labels(labels, config), logits,
                                                         name="softmax_loss")
    else:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
    return flow.math.reduce_mean(loss)


def optimizer(config: ResNetConfig, total_steps: int, warmup_steps: int | None = None):
    """Momentum SGD, cosine decay over the steps after a linear warmup from 0 (default: a tenth of them)."""
    warmup = max(1, total_steps // 10) if warmup_steps is None else warmup_steps
    lr = flow.optimizer.CosineScheduler(config.learning_rate, steps=max(total_steps - warmup, 1),
                                        warmup=flow.optimizer.warmup.linear(warmup, 0.0) if warmup else None)
    return flow.optimizer.SGD(lr, momentum=config.momentum)


# --------------------------------------------------------------------------------------------- jobs

def make_jobs(config: ResNetConfig = CONFIGS["tiny"], total_steps: int = 100,
              warmup_steps: int | None = None) -> Tuple[Callable, Callable]:
    """(train job, predict job) for `config`: both take (images, labels) as `synthetic_batch` makes
    them; the train job returns the mean loss, the predict job the softmax probabilities (B, classes).
    Without a config, the tiny one (for `flowc show` and the like).

    Example:
        train, predict = make_jobs(CONFIGS["tiny"], total_steps=10)
        loss = train(*synthetic_batch(CONFIGS["tiny"]))
    """
    images_t = tp.Numpy.Placeholder(image_shape(config), dtype=flow.float)
    labels_t = tp.Numpy.Placeholder((config.batch_size,), dtype=flow.int32)

    def resnet_train(images: images_t, labels: labels_t) -> tp.Numpy:
        loss = classification_loss(resnet(images, config, training=True), labels, config)
        optimizer(config, total_steps, warmup_steps).minimize(loss)
        return loss

    def resnet_predict(images: images_t, labels: labels_t) -> tp.Numpy:
        return flow.nn.softmax(resnet(images, config, training=False))

    return flow.global_function(type="train")(resnet_train), flow.global_function(type="predict")(resnet_predict)


def synthetic_batch(config: ResNetConfig, seed: int = 0) -> list:
    """(images, labels): normalised random images in the config's data format whose class shows in
    their mean colour (so that there is something to learn), and int32 labels.

    Example:
        images, labels = synthetic_batch(CONFIGS["tiny"], seed=1)
    """
    rng = np.random.default_rng(seed)
    b, s = config.batch_size, config.image_size
    labels = rng.integers(0, config.num_classes, b).astype(np.int32)
    images = rng.standard_normal((b, 3, s, s)).astype(np.float32)
    tint = np.stack([np.cos(labels * 2.1), np.sin(labels * 1.3), np.cos(labels * 0.7)], axis=1)
    images += tint[:, :, None, None].astype(np.float32)
    if channels_last(config):
        images = np.ascontiguousarray(images.transpose(0, 2, 3, 1))
    return [images, labels]


def main(argv=None) -> int:
    def more(p):
        p.add_argument("--image-size", type=int, default=0, help="image height and width (default: the config's)")
        p.add_argument("--data-format", choices=["NCHW", "NHWC"], default="NCHW",
                       help="layout of images and activations (default: NCHW)")
    args = parse_args("ResNet image classification on synthetic data.", list(CONFIGS), "resnet18", argv=argv,
                      more=more)
    if args.image_size < 0:
        raise SystemExit("resnet.py: --image-size must be positive (or 0 for the config's)")
    config = replace(CONFIGS[args.config], data_format=args.data_format)
    if args.batch_size:
        config = replace(config, batch_size=args.batch_size)
    if args.image_size:
        config = replace(config, image_size=args.image_size)
    train, _ = make_jobs(config, total_steps=args.steps)
    batches = [synthetic_batch(config, args.seed + i) for i in range(4)]
    return train_loop(train, batches, args, f"resnet-{args.config}")


if __name__ == "__main__":
    sys.exit(main())
