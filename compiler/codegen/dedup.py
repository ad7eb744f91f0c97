"""One function per distinct kernel: kernels that differ only in which buffers they touch share code.

A model repeats itself: BERT-base's twelve encoder layers give twelve copies of every kernel of a
layer (same ops, shapes, dtypes, attributes and fusion), and the backward pass and the optimizer add
more.  The compiler's time goes into optimising each function body, so a step is built with each
distinct body once; every kernel is still its own call (or launch), with its own buffers as arguments.

Two rendered kernels are the same function when their texts are equal after
  * comment lines are dropped (they name the kernel's nodes and the user's source lines),
  * the kernel's own name is replaced by a placeholder,
  * the identifiers generated from node ids (`b<id>` for a buffer parameter, `v<id>` for a fused
    value) are renumbered in order of first appearance.
The renaming is a bijection of local names, so equal signatures mean alpha-equivalent functions: the
same code with the same parameter list (types, const, restrict) in the same order.  What differs between
two calls (the buffers, an error code passed as an argument) is in the call, not in the function.

    table = KernelTable()
    fn, first = table.add(text, "k12_add")      # ("k12_add", True) the first time
    fn, first = table.add(text2, "k40_add")     # ("k12_add", False) when text2 is the same kernel
"""
from __future__ import annotations

import re

# Identifiers a generator derives from node ids: buffer parameters and fused values (common.py).
_NODE_NAME = re.compile(r"\b([bv])(\d+)\b")
_COMMENT_LINE = re.compile(r"^[ \t]*//.*$", re.MULTILINE)
NAME_PLACEHOLDER = "@kernel@"     # not an identifier: it cannot meet one in the text


def kernel_signature(text: str, name: str) -> str:
    """`text` (a rendered kernel named `name`) in canonical form: equal forms are one function."""
    body = _COMMENT_LINE.sub("", text)
    body = re.sub(rf"\b{re.escape(name)}", NAME_PLACEHOLDER, body)   # also `name_sum`, a companion kernel
    renamed: dict[str, str] = {}

    def rename(m: re.Match) -> str:
        token = m.group(0)
        if token not in renamed:
            renamed[token] = f"{m.group(1)}{len(renamed)}"
        return renamed[token]

    return _NODE_NAME.sub(rename, body)


class KernelTable:
    """The distinct kernels of a step, in order of first use, and which function each kernel calls."""

    def __init__(self) -> None:
        self._by_signature: dict[str, str] = {}
        self.sources: list[str] = []        # one rendered function per distinct kernel
        self.calls = 0                      # kernels added

    def add(self, text: str, name: str) -> tuple[str, bool]:
        """The function that kernel `name` (rendered as `text`) calls, and whether `text` is new."""
        self.calls += 1
        signature = kernel_signature(text, name)
        known = self._by_signature.get(signature)
        if known is not None:
            return known, False
        self._by_signature[signature] = name
        self.sources.append(text)
        return name, True
