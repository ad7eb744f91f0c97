"""DCGAN on synthetic images, in OneFlow-Benchmark's style (its Generative/dcgan.py).

Two train jobs share one session and one set of variables, as a GAN's do:

* `train_generator(z)`: the generator (trainable) feeds the discriminator (trainable=False: it is read,
  never updated, by this job); the loss is the sigmoid cross-entropy of the fakes against label 1;
* `train_discriminator(z, images)`: the generator (trainable=False, so its batch norms use their moving
  statistics, as in OneFlow) makes fakes; the discriminator (trainable) scores fakes against label 0 and
  real images against label 1;
* `eval_generator(z)`: a predict job, the generator alone.

The generator is dense (no bias) -> batch norm -> relu -> reshape to (C0, s/4, s/4) -> 5x5 deconvolution
(stride 1) -> batch norm -> relu -> 5x5 deconvolution (stride 2) -> batch norm -> relu -> 5x5
deconvolution (stride 2) to the image's channels -> tanh.  OneFlow 0.3.4's `flow.layers` has no
transposed-convolution layer, so `deconv2d` below makes its weight with `flow.get_variable` and calls
`flow.nn.conv2d_transpose`, as OneFlow-Benchmark's layers.py does.  The discriminator is two 5x5
stride-2 `flow.layers.conv2d` with leaky_relu (alpha 0.3) and dropout (0.3), then a dense layer to one
logit.  Variables carry the benchmark's names: `g_fc1-weight`, `g_bn1-gamma`, `g_deconv2-weight`,
`d_conv1-weight`, `d_fc-weight`, ...

    python examples/models/dcgan.py --config tiny --steps 20
    python examples/models/dcgan.py --config mnist --steps 10 --save /tmp/dcgan
"""
# (no `from __future__ import annotations`: the job functions' placeholder annotations are local names)

import os
import sys
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple, Tuple

import numpy as np

import flow
import flow.typing as tp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from progress import parse_args, train_loop  # noqa: E402


@dataclass(frozen=True)
class DCGANConfig:
    """The sizes of one DCGAN, and the batch its jobs are compiled for."""
    image_size: int                       # square images, a multiple of 4
    channels: int
    z_dim: int
    generator_channels: Tuple[int, int, int]      # after the dense layer, after deconv1, after deconv2
    discriminator_channels: Tuple[int, int]
    batch_size: int
    eval_size: int = 16
    learning_rate: float = 1e-4
    beta1: float = 0.5
    leaky_alpha: float = 0.3
    dropout_rate: float = 0.3


CONFIGS = {
    "tiny": DCGANConfig(image_size=8, channels=1, z_dim=16, generator_channels=(16, 8, 4),
                        discriminator_channels=(4, 8), batch_size=4, eval_size=4, learning_rate=2e-3),
    "mnist": DCGANConfig(image_size=28, channels=1, z_dim=100, generator_channels=(256, 128, 64),
                         discriminator_channels=(64, 128), batch_size=32),
}


def _init():
    return flow.random_normal_initializer(stddev=0.02)


def deconv2d(x, filters: int, size: int, name: str, strides: int = 2, trainable: bool = True):
    """A "SAME" transposed convolution (N, C, H, W) -> (N, filters, H * strides, W * strides) with the
    weight `<name>-weight` of shape (C, filters, size, size) and no bias (as OneFlow-Benchmark's)."""
    n, c, h, w = x.shape
    weight = flow.get_variable(name + "-weight", shape=(c, filters, size, size), dtype=x.dtype,
                               initializer=_init(), trainable=trainable)
    return flow.nn.conv2d_transpose(x, weight, output_shape=(n, filters, h * strides, w * strides),
                                    strides=strides, padding="SAME", data_format="NCHW", name=name)


def batch_norm(x, name: str, trainable: bool):
    return flow.layers.batch_normalization(x, axis=1, name=name, trainable=trainable)


def generator(z, config: DCGANConfig, trainable: bool = True):
    """(N, z_dim) noise -> (N, channels, size, size) images in (-1, 1)."""
    c0, c1, c2 = config.generator_channels
    s = config.image_size // 4
    h = flow.layers.dense(z, c0 * s * s, use_bias=False, kernel_initializer=_init(), trainable=trainable,
                          name="g_fc1")
    h = flow.math.relu(batch_norm(h, "g_bn1", trainable))
    h = flow.reshape(h, (-1, c0, s, s))
    h = flow.math.relu(batch_norm(deconv2d(h, c1, 5, "g_deconv1", 1, trainable), "g_bn2", trainable))
    h = flow.math.relu(batch_norm(deconv2d(h, c2, 5, "g_deconv2", 2, trainable), "g_bn3", trainable))
    return flow.math.tanh(deconv2d(h, config.channels, 5, "g_deconv3", 2, trainable))


def discriminator(images, config: DCGANConfig, trainable: bool = True):
    """(N, channels, size, size) -> (N, 1) logits: real (> 0) or fake."""
    h = images
    for i, filters in enumerate(config.discriminator_channels):
        h = flow.layers.conv2d(h, filters, 5, strides=2, padding="SAME", kernel_initializer=_init(),
                               trainable=trainable, name=f"d_conv{i + 1}")
        h = flow.nn.dropout(flow.nn.leaky_relu(h, config.leaky_alpha), rate=config.dropout_rate)
    h = flow.reshape(h, (h.shape[0], -1))
    return flow.layers.dense(h, 1, kernel_initializer=_init(), trainable=trainable, name="d_fc")


def _bce(logits, label: float):
    """Mean sigmoid cross-entropy of `logits` against a constant label (1 real, 0 fake)."""
    labels = flow.ones_like(logits) if label else flow.zeros_like(logits)
    return flow.math.reduce_mean(flow.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))


def _adam(config: DCGANConfig):
    return flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [config.learning_rate]),
                               beta1=config.beta1)


class Jobs(NamedTuple):
    """The three jobs of one DCGAN (they share the session's variables)."""
    train_generator: Callable
    train_discriminator: Callable
    eval_generator: Callable


def make_jobs(config: DCGANConfig = CONFIGS["tiny"]) -> Jobs:
    """The generator and discriminator train jobs and the generator's predict job for `config`.

    `train_generator(z)` returns (generator loss, the fakes); `train_discriminator(z, images)` returns
    (discriminator loss, its fake part, its real part); `eval_generator(z)` the images of `eval_size`
    noise vectors.

    Example:
        jobs = make_jobs(CONFIGS["tiny"])
        z, images = synthetic_batch(CONFIGS["tiny"])
        d_loss, _, _ = jobs.train_discriminator(z, images)
        g_loss, fakes = jobs.train_generator(z)
    """
    b, s = config.batch_size, config.image_size
    z_t = tp.Numpy.Placeholder((b, config.z_dim), dtype=flow.float)
    images_t = tp.Numpy.Placeholder((b, config.channels, s, s), dtype=flow.float)
    eval_t = tp.Numpy.Placeholder((config.eval_size, config.z_dim), dtype=flow.float)

    def train_generator(z: z_t) -> Tuple[tp.Numpy, tp.Numpy]:
        fakes = generator(z, config, trainable=True)
        g_loss = _bce(discriminator(fakes, config, trainable=False), 1.0)
        _adam(config).minimize(g_loss)
        return g_loss, fakes

    def train_discriminator(z: z_t, images: images_t) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        fakes = generator(z, config, trainable=False)
        d_loss_fake = _bce(discriminator(fakes, config, trainable=True), 0.0)
        d_loss_real = _bce(discriminator(images, config, trainable=True), 1.0)
        d_loss = d_loss_fake + d_loss_real
        _adam(config).minimize(d_loss)
        return d_loss, d_loss_fake, d_loss_real

    def eval_generator(z: eval_t) -> tp.Numpy:
        return generator(z, config, trainable=False)

    return Jobs(flow.global_function(type="train")(train_generator),
                flow.global_function(type="train")(train_discriminator),
                flow.global_function(type="predict")(eval_generator))


def synthetic_images(config: DCGANConfig, n: int, seed: int = 0) -> np.ndarray:
    """`n` images in [-1, 1] of one bright Gaussian spot each (random place and width) on a dark field.

    Example:
        images = synthetic_images(CONFIGS["tiny"], 8)          # (8, 1, 8, 8)
    """
    rng = np.random.default_rng(seed)
    s = config.image_size
    grid = np.arange(s, dtype=np.float32)
    cy, cx = rng.uniform(s * 0.25, s * 0.75, (2, n, 1, 1))
    width = rng.uniform(s * 0.08, s * 0.2, (n, 1, 1))
    spot = np.exp(-((grid[None, :, None] - cy) ** 2 + (grid[None, None, :] - cx) ** 2) / (2 * width ** 2))
    images = np.repeat((spot * 2.0 - 1.0)[:, None], config.channels, axis=1)
    return images.astype(np.float32)


def synthetic_batch(config: DCGANConfig, seed: int = 0) -> list[np.ndarray]:
    """(z, images): standard-normal noise (batch, z_dim) and a batch of synthetic images.

    Example:
        z, images = synthetic_batch(CONFIGS["tiny"], seed=1)
    """
    rng = np.random.default_rng(seed + 10_000)
    z = rng.standard_normal((config.batch_size, config.z_dim)).astype(np.float32)
    return [z, synthetic_images(config, config.batch_size, seed)]


def gan_step(jobs: Jobs) -> Callable:
    """One GAN step: a discriminator step then a generator step on the same noise; returns
    (discriminator loss, generator loss), the step `train_loop` runs."""
    def step(z, images):
        d_loss, _, _ = jobs.train_discriminator(z, images)
        g_loss, _ = jobs.train_generator(z)
        return np.array([float(np.mean(d_loss)), float(np.mean(g_loss))])
    return step


def main(argv=None) -> int:
    args = parse_args("DCGAN on synthetic images (one discriminator and one generator step per step).",
                      list(CONFIGS), "tiny", argv=argv)
    config = CONFIGS[args.config]
    if args.batch_size:
        config = replace(config, batch_size=args.batch_size)
    jobs = make_jobs(config)
    batches = [synthetic_batch(config, args.seed + i) for i in range(8)]
    return train_loop(gan_step(jobs), batches, args, f"dcgan-{args.config}")


if __name__ == "__main__":
    sys.exit(main())
