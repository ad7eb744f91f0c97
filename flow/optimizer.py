"""`flow.optimizer`: SGD, Adam and learning-rate schedules."""
from compiler.optimizers import SGD, Adam, PiecewiseConstantScheduler  # noqa: F401

__all__ = ["SGD", "Adam", "PiecewiseConstantScheduler"]
