"""A job graph's fingerprint, to check that every rank of a distributed job built the same one.

Each rank of a distributed session traces the script's jobs itself; if the scripts differ (another
version on one machine, a branch on the rank), the ranks' steps would meet in the wrong
collectives and hang or sum unrelated gradients.  The master sends its fingerprint with the first
step of each job; a worker whose graph differs refuses the step and names the first differing op.

Example::

    >>> mine = signature(graph)                           # doctest: +SKIP
    >>> first_difference(mine, theirs)                    # None when they agree
"""
from __future__ import annotations

from flowc.compiler.ir import Graph


def signature(graph: Graph) -> list[str]:
    """One line per node: op, inputs, result type and attributes (not the source line, which the
    message shows but which may legitimately differ between checkouts), then results and assigns."""
    lines = [f"%{n.id} = {n.op}({', '.join(f'%{i}' for i in n.inputs)}) : {n.type} {dict(n.attrs)!r}"
             for n in graph.nodes]
    lines.append(f"return {list(graph.outputs)}")
    lines.extend(f"assign {var} <- %{node}" for var, node in sorted(graph.assigns.items()))
    return lines


def locations(graph: Graph) -> list[str]:
    """The user's source line of each node, in the order of `signature`."""
    return [n.loc for n in graph.nodes]


def first_difference(mine: list[str], theirs: list[str]) -> int | None:
    """The index of the first line where two signatures differ (the shorter one's end if one is a
    prefix of the other); None when they are equal."""
    for i, (a, b) in enumerate(zip(mine, theirs)):
        if a != b:
            return i
    return None if len(mine) == len(theirs) else min(len(mine), len(theirs))
