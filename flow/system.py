"""`flow.system`: OneFlow's older home of `assign`.

Example:
    flow.system.assign(step_counter, step_counter + 1)
"""
from flow.indexing import assign

__all__ = ["assign"]
