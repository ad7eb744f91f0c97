"""Errors users see, each pointing at their own source line where one is known."""
from __future__ import annotations


class FlowError(Exception):
    """Base of flowc's own errors."""


class TraceError(FlowError, ValueError):
    """A job function misuses an op while it is traced; the message starts with the user's file:line."""


class JobCallError(FlowError, TypeError):
    """A job function was called with arguments that do not match its placeholders."""


class StepError(FlowError, RuntimeError):
    """A compiled step failed at run time (for example a label out of range)."""


class UnsupportedError(FlowError, NotImplementedError):
    """A OneFlow feature flowc knows of but does not implement (eager mode, user_op_builder, OFRecord
    readers, some FunctionConfig options); the message names the feature and why."""


class DistributedError(StepError):
    """A distributed job lost a rank, timed out waiting for one, or its ranks disagree (graphs)."""
