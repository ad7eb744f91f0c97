"""`flow.deprecated`: OneFlow 0.3's deprecated names that flowc keeps.

Example:
    with flow.deprecated.variable_scope("encoder"):     # DeprecationWarning; flow.scope.namespace
        w = flow.get_variable("w", shape=(4, 4))
"""
from flow.more_ops import variable_scope

__all__ = ["variable_scope"]
