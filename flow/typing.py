"""`flow.typing` (imported as `tp`): placeholders for inputs and annotations for results.

Example:
    import flow.typing as tp
    def job(x: tp.Numpy.Placeholder((100, 784), dtype=flow.float)) -> tp.Numpy: ...
"""
from flowc.runtime.signature import Bundle, Callback, ListListNumpy, ListNumpy, Numpy  # noqa: F401

__all__ = ["Numpy", "ListNumpy", "ListListNumpy", "Callback", "Bundle"]
