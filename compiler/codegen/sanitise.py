"""What may enter a generated C++/CUDA source: text the generator built, or text made safe for a comment.

Every `{{ value }}` of every template goes through `emit`, the Jinja2 environment's `finalize`
(compiler/codegen/templates.py), so no template can leave it out.  `emit` lets through unchanged
only `CodeText` (text a code generator built from its own data: kernel bodies, call lines,
buffer names, comments assembled from sanitised pieces) and numbers, which it spells
canonically.  Any other value (a job's name, a variable's name, the user's file name, anything
a generator forgot to mark) is treated as untrusted text and written as `comment_text`: one
line, no comment delimiters, no line splice, bounded length.  A forgotten mark therefore fails
safe: the text is sanitised (and a golden-source test shows the difference), never pasted raw.

User text only ever appears inside comments: identifiers in generated code are generated
(`b<node id>`, `<op>_<node id>`), never user names.
"""
from __future__ import annotations

import math
import re
import unicodedata
from typing import Any, Iterable

import jinja2
import numpy as np

from flowc.compiler.ir import is_number, plain_number

# Untrusted text is cut to this many characters (a 10,000-character job name is not a comment).
MAX_COMMENT_CHARS = 200
_ELLIPSIS = "..."
# Unicode categories that must not reach a source line: controls (NUL, CR, LF, NEL, ESC...),
# format characters (bidirectional overrides: "Trojan Source"), line and paragraph separators
# (U+2028, U+2029), and lone surrogates (not encodable as UTF-8).
_UNSAFE_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Cs")
_SPACE_LIKE = "\t\n\v\f\r\x1c\x1d\x1e\x1f\x85\u2028\u2029"
# A comment delimiter: `*/` ends a block comment, `/*` starts one; split the pair with a space.
_DELIMITER = re.compile(r"(?<=/)(?=\*)|(?<=\*)(?=/)")
# `??/` is the trigraph for a backslash (ISO C++ before 17 and -trigraphs): no `??` at all.
_TRIGRAPH = re.compile(r"\?(?=\?)")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class CodeText(str):
    """Text a code generator built itself, from its own data: templates emit it unchanged.

    Never construct one from user text (names, file names, repr of user objects): build such a
    line with `code_format`, which sanitises every piece that is not already `CodeText`.
    Slicing or joining a `CodeText` gives a plain `str` again (untrusted): mark the result.
    """
    __slots__ = ()


def code(text: str) -> CodeText:
    """Mark generator-built `text` as code (see `CodeText`)."""
    return text if isinstance(text, CodeText) else CodeText(str.__str__(text))


def c_identifier(name: str) -> CodeText:
    """A generated identifier (kernel name) as code; anything that is not a C identifier is a bug."""
    if not (isinstance(name, str) and _IDENTIFIER.fullmatch(name)):
        raise ValueError(f"not a generated C identifier: {name!r}")
    return CodeText(str.__str__(name))


def code_lines(lines: Iterable[str]) -> list[CodeText]:
    """Mark generator-built lines as code."""
    return [code(line) for line in lines]


def code_format(template: str, *args: Any, **kwargs: Any) -> CodeText:
    """`template.format(...)` as code, every argument passed through `emit` first.

    `template` is the generator's own literal; arguments that are not `CodeText` or numbers are
    sanitised as comment text, so user names can be part of a generated comment.
    """
    return CodeText(template.format(*(emit(a) for a in args), **{k: emit(v) for k, v in kwargs.items()}))


def comment_text(value: Any, limit: int = MAX_COMMENT_CHARS) -> str:
    """`value` as text safe anywhere in a `//` or `/* */` comment of generated C++ or CUDA.

    One line (newlines, CR, U+2028/U+2029 and other control or format characters become a
    space or `?`), no backslash (a trailing one continues a `//` comment onto the next line), no
    `/*` or `*/`, no `??` (trigraphs), at most `limit` characters.  Idempotent, and the identity
    on ordinary text (names, file names, `file.py:12`).
    """
    text = value if type(value) is str else str.__str__(value) if isinstance(value, str) else str(value)
    if not text.isprintable() or "\\" in text:
        text = "".join(_safe_char(c) for c in text)
    text = _DELIMITER.sub(" ", text)
    text = _TRIGRAPH.sub("?_", text)
    if len(text) > limit:
        text = text[:limit - len(_ELLIPSIS)] + _ELLIPSIS
    return text


def _safe_char(c: str) -> str:
    if c == "\\":
        return "/"
    if c in _SPACE_LIKE:
        return " "
    return "?" if unicodedata.category(c) in _UNSAFE_CATEGORIES else c


def c_literal(value: Any) -> CodeText:
    """A number as a C/C++/CUDA literal in canonical form (NaN and infinities by <cmath>'s macros).

    bool -> 1 / 0; int -> its decimal digits; float -> Python's shortest round-trip repr, which
    C reads back to the same double.  Anything else is a TypeError: attributes that are not
    numbers never become code.
    """
    number = plain_number(value)
    if isinstance(number, bool):
        return CodeText("1" if number else "0")
    if isinstance(number, int):
        return CodeText(int.__repr__(number))
    if math.isnan(number):
        return CodeText("NAN")
    if math.isinf(number):
        return CodeText("INFINITY" if number > 0 else "-INFINITY")
    return CodeText(float.__repr__(number))


def c_string(value: str) -> CodeText:
    """`value` (hostile text: a job's or a variable's name) as a C/C++ string literal, quotes included.

    Its UTF-8 bytes: printable ASCII as is, except `"`, `\\` and `?` (a trigraph's start), which are
    escaped; every other byte as a three-digit octal escape (never a hex escape, which would run on
    into a following hex digit).  The literal's bytes are exactly the text's UTF-8 bytes.

    Example:
        >>> print(c_string('say "hi"'))
        "say \\"hi\\""
    """
    out = []
    for byte in str.__str__(value).encode("utf-8", errors="surrogatepass"):
        ch = chr(byte)
        if ch in '"\\?':
            out.append("\\" + ch)
        elif 0x20 <= byte < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return CodeText('"' + "".join(out) + '"')


def emit(value: Any) -> str:
    """The environment's `finalize`: what `{{ value }}` writes into a generated source.

    `CodeText` as is; numbers canonically (ints as digits, bools as `true`/`false`, floats as
    `c_literal`); tuples and lists of numbers (grids, shapes) as Python prints them; everything
    else as untrusted `comment_text`.
    """
    if isinstance(value, CodeText):
        return value
    if isinstance(value, (bool, np.bool_)):
        return CodeText("true" if value else "false")
    if is_number(value):
        return c_literal(value)
    if isinstance(value, (tuple, list)) and all(is_number(v) and not isinstance(v, (bool, np.bool_))
                                                for v in value):
        items = ", ".join(emit(v) for v in value)
        if isinstance(value, tuple):
            return CodeText(f"({items},)" if len(value) == 1 else f"({items})")
        return CodeText(f"[{items}]")
    return comment_text(value)


def join(items: Iterable[Any], separator: str = "") -> str:
    """The `join` filter: `CodeText` when every item and the separator would be emitted unchanged.

    Jinja2's own `join` returns a plain `str`, which `emit` would sanitise as a whole (and cut
    to MAX_COMMENT_CHARS); joining generated parameter lists must keep them code.
    """
    parts = [emit(item) for item in items]
    sep = emit(separator)
    joined = sep.join(parts)
    trusted = all(isinstance(p, CodeText) for p in parts) and sep == separator
    return CodeText(joined) if trusted else joined


# -- the Jinja2 side: an environment no template can render around ---------------------------------
class CodegenEnvironment(jinja2.Environment):
    """A Jinja2 environment whose every `{{ value }}` goes through `emit` (passing another `finalize`
    is an error) and whose `join` keeps generated lists `CodeText`.

    What a template or macro renders is `CodeText`: template text plus values that went through
    `emit` (Jinja2 assembles both with `concat`).
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(finalize=emit, **options)
        self.filters["join"] = join

    @staticmethod
    def concat(parts: Iterable[str]) -> CodeText:
        return CodeText("".join(parts))
