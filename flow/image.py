"""`flow.image`: OneFlow's image ops work on OFRecord tensor buffers, which flowc does not support yet.

Every name OneFlow 0.3 has here is bound to a function that raises `flow.UnsupportedError` naming it
(flow/unsupported.py).

Example:
    flow.image.resize(images, resize_x=224, resize_y=224)   # UnsupportedError: flow.image.resize ...
"""
from flow import unsupported as _unsupported

globals().update(_unsupported.stubs("image"))
__all__ = list(_unsupported.stubs("image"))
