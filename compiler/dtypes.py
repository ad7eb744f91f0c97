"""flow's dtype objects (`flow.float32`, `flow.int32`, ...), thin names over IR dtype names."""
from __future__ import annotations

import numpy as np


class DType:
    """A data type as users write it: `flow.float`, `flow.int32`, ...

    Example:
        flow.float32.numpy_dtype  # dtype('float32')
    """

    def __init__(self, ir_name: str, name: str | None = None) -> None:
        self.ir_name = ir_name
        self.name = name or ir_name      # OneFlow's name: `char` is stored as int8 (NumPy's byte)

    @property
    def numpy_dtype(self) -> np.dtype:
        return np.dtype(self.ir_name)

    def __eq__(self, other: object) -> bool:
        other_name = getattr(other, "ir_name", None)
        if other_name is None:
            # Only real dtype spellings compare: np.dtype(None) would mean float64.
            if not isinstance(other, (np.dtype, str)) and not (isinstance(other, type)
                                                             and issubclass(other, np.generic)):
                return NotImplemented
            try:
                other_name = np.dtype(other).name
            except TypeError:
                return NotImplemented
        return self.ir_name == other_name

    def __hash__(self) -> int:
        return hash(np.dtype(self.ir_name))   # equal to NumPy's dtype, so it hashes like it

    def __repr__(self) -> str:
        return f"flow.{self.name}"


float16 = DType("float16")   # stored as IEEE binary16; flowc computes it in float32 (see compiler/passes/float16.py)
half = float16
float32 = DType("float32")
float64 = DType("float64")
int8 = DType("int8")
uint8 = DType("uint8")
int32 = DType("int32")
int64 = DType("int64")
char = DType("int8", "char")
BY_NAME = {d.ir_name: d for d in (float16, float32, float64, int8, uint8, int32, int64)}


def convert_oneflow_dtype_to_numpy_dtype(oneflow_dtype: DType) -> type:
    """The NumPy scalar type of a flow dtype, as OneFlow's function of that name returns it.

    Example:
        flow.convert_oneflow_dtype_to_numpy_dtype(flow.float32)   # numpy.float32
        flow.convert_oneflow_dtype_to_numpy_dtype(flow.char)      # numpy.int8 (numpy.byte)
    """
    if not isinstance(oneflow_dtype, DType):
        raise TypeError(f"flow.convert_oneflow_dtype_to_numpy_dtype: expected a flow dtype such as flow.float32, "
                        f"got {oneflow_dtype!r}")
    return oneflow_dtype.numpy_dtype.type
