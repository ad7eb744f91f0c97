# basics_topics (optimizer_in_function_config, OneFlow 0.3): the function_config holds settings of the
# job (default data type, automatic mixed precision, logical view); the optimizer, learning-rate schedule,
# warmup and gradient clipping are chosen inside the job with flow.optimizer.  Each of the page's six
# optimizers and three schedules trains a small regression for a few steps.
import numpy as np

import flow
import flow.typing as tp

BATCH, FEATURES = 16, 8
STEPS = 6


def get_train_config():
    config = flow.function_config()
    config.default_data_type(flow.float)                     # default data type
    config.enable_auto_mixed_precision(True)                 # automatic mixed precision
    config.default_logical_view(flow.scope.consistent_view())
    return config


def get_eval_config():
    config = flow.function_config()
    config.default_data_type(flow.float)
    return config


def model(x, prefix):
    hidden = flow.layers.dense(x, 16, activation=flow.nn.relu, name=f"{prefix}-hidden",
                               kernel_initializer=flow.random_normal_initializer(stddev=0.3, seed=1))
    return flow.layers.dense(hidden, 1, name=f"{prefix}-out",
                             kernel_initializer=flow.random_normal_initializer(stddev=0.3, seed=2))


def squared_error(x, y, prefix):
    return flow.math.reduce_mean(flow.math.square(model(x, prefix) - y))


def train_job_with(prefix, make_optimizer, function_config=None):
    @flow.global_function(type="train", function_config=function_config)
    def train_job(x: tp.Numpy.Placeholder((BATCH, FEATURES)), y: tp.Numpy.Placeholder((BATCH, 1))) -> tp.Numpy:
        loss = squared_error(x, y, prefix)
        make_optimizer().minimize(loss)
        return loss
    return train_job


constant = flow.optimizer.PiecewiseConstantScheduler([], [0.01])
JOBS = {
    "SGD, momentum 0.9, clipped by global norm": train_job_with("sgd", lambda: flow.optimizer.SGD(
        flow.optimizer.PiecewiseConstantScheduler([], [0.05]), momentum=0.9,
        grad_clipping=flow.optimizer.grad_clipping.by_global_norm(1))),
    "Adam, piecewise scaling": train_job_with("adam", lambda: flow.optimizer.Adam(
        flow.optimizer.PiecewiseScalingScheduler(0.01, [30, 60, 90], 0.1))),
    "AdamW, cosine with linear warmup": train_job_with("adamw", lambda: flow.optimizer.AdamW(
        flow.optimizer.CosineScheduler(base_lr=0.01, steps=10000, warmup=flow.optimizer.warmup.linear(3, 0)),
        weight_decay=0.01)),
    "LazyAdam": train_job_with("lazy_adam", lambda: flow.optimizer.LazyAdam(constant)),
    "LARS": train_job_with("lars", lambda: flow.optimizer.LARS(
        flow.optimizer.PiecewiseConstantScheduler([], [0.1]))),
    "RMSProp": train_job_with("rmsprop", lambda: flow.optimizer.RMSProp(constant)),
    "SGD, automatic mixed precision": train_job_with("amp", lambda: flow.optimizer.SGD(
        flow.optimizer.PiecewiseConstantScheduler([], [0.05]), momentum=0), get_train_config()),
}


@flow.global_function(type="predict", function_config=get_eval_config())
def eval_job(x: tp.Numpy.Placeholder((BATCH, FEATURES)), y: tp.Numpy.Placeholder((BATCH, 1))) -> tp.Numpy:
    return squared_error(x, y, "sgd")


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32)
    y = (x @ rng.standard_normal((FEATURES, 1)) * 0.5).astype(np.float32)
    for title, job in JOBS.items():
        losses = [job(x, y).item() for _ in range(STEPS)]      # a (1,) array, as in OneFlow
        print(f"{title}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(f"eval after training: loss {eval_job(x, y).item():.4f}")
