"""`flow.optimizer`: SGD, Adam and learning-rate schedules."""
from flowc.compiler.optimizers import SGD, Adam, PiecewiseConstantScheduler  # noqa: F401

__all__ = ["SGD", "Adam", "PiecewiseConstantScheduler"]
