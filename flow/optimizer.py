"""`flow.optimizer`: optimizers, learning-rate schedules, warmup, gradient clipping and loss scaling."""
from flowc.compiler.optimizers import (LAMB, LARS, SGD, SGDW, Adam, AdamW,  # noqa: F401
                                       CosineScheduler, ExponentialScheduler,
                                       InverseTimeScheduler, LazyAdam, LinearCosineScheduler, LrScheduler,
                                       NaturalExpScheduler, Optimizer, PiecewiseConstantScheduler,
                                       PiecewiseScalingScheduler, PolynomialSchduler, PolynomialScheduler, RMSProp,
                                       grad_clipping, loss_scale, warmup)

__all__ = ["SGD", "SGDW", "Adam", "AdamW", "LazyAdam", "LAMB", "LARS", "RMSProp", "Optimizer",
           "LrScheduler", "PiecewiseConstantScheduler", "PiecewiseScalingScheduler", "PolynomialScheduler",
           "PolynomialSchduler", "CosineScheduler", "LinearCosineScheduler", "ExponentialScheduler",
           "InverseTimeScheduler", "NaturalExpScheduler",
           "grad_clipping", "warmup", "loss_scale"]
