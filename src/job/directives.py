"""A CUDA source as the C preprocessor reads it: its lines with backslash-newlines spliced and
each comment one space (translation phases 2 and 3), and which of them are #include directives.

compile.expand_source pastes headers by this reading, so that every form the preprocessor
accepts (`# include`, `%:include`, a comment after the name or before the `#`, a directive split
by a backslash-newline, a macro for the name) is seen and either pasted or refused: none reaches
NVRTC, which would read any file on the machine that such a line names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

# `#`, or its digraph `%:` (C++), or its trigraph `??=`; then the directive's name
_DIRECTIVE = re.compile(r"\s*(?:#|%:|\?\?=)\s*([A-Za-z_]\w*)(.*)", re.DOTALL)


# Directives that read another file (GCC's and EDG's, C23's #embed); only #include is allowed.
INCLUDE_FORMS = ("include", "include_next", "import", "embed")


# A header name as written: "file" or <file>, nothing after it.
_QUOTED = re.compile(r'"([^"]+)"')
_ANGLED = re.compile(r"<([^>]+)>")


# An encoding prefix before a raw string's R (R"x(...)x", u8R"(...)").
_RAW_PREFIX = re.compile(r"(?<![\w])(?:u8|u|U|L)?R$")


@dataclass(frozen=True)
class Line:
    """One logical line: physical lines `first`..`last` (1-based) as the preprocessor reads them."""

    first: int
    last: int
    text: str


@dataclass(frozen=True)
class Include:
    """An include-like directive: its name (`include`, `import`, ...) and what follows it, as
    the preprocessor reads it (comments gone)."""

    name: str
    operand: str

    def header(self) -> tuple[str, str] | None:
        """('"', file) or ('<', file) for a literal header name; None for anything else (a macro,
        trailing tokens, nothing)."""
        operand = self.operand.strip()
        for kind, pattern in (('"', _QUOTED), ("<", _ANGLED)):
            match = pattern.fullmatch(operand)
            if match:
                return kind, match.group(1)
        return None


def include_of(line: Line) -> Include | None:
    """The include-like directive on `line`, else None."""
    match = _DIRECTIVE.match(line.text)
    if match is None or match.group(1) not in INCLUDE_FORMS:
        return None
    return Include(match.group(1), match.group(2))


def logical_lines(text: str) -> Iterator[Line]:
    """`text`'s lines as the preprocessor reads them. A line inside a block comment belongs to
    the line the comment began on (a directive goes on past a comment's line break). String,
    character and raw string literals are skipped whole, so no `//` or `/*` in them starts a
    comment; a `'` inside a number is a digit separator (1'000), not a character literal."""
    out: list[str] = []
    first = line = 1
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("\\\n", i):  # a splice: the next line continues this one
            i, line = i + 2, line + 1
        elif c == "\n":
            yield Line(first, line, "".join(out))
            out, line, i = [], line + 1, i + 1
            first = line
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            line, i = line + text.count("\n", i, end), end
            out.append(" ")
        elif text.startswith("//", i):
            end = _line_end(text, i)
            line, i = line + text.count("\n", i, end), end
            out.append(" ")
        elif c == '"' and _RAW_PREFIX.search("".join(out[-4:])):
            end = _raw_string_end(text, i)
            line += text.count("\n", i, end)
            out.append(text[i:end].replace("\n", " "))
            i = end
        elif c in "\"'" and not (c == "'" and _in_number(out)):
            end = _literal_end(text, i)
            line += text.count("\n", i, end)  # only spliced line breaks
            out.append(text[i:end].replace("\\\n", ""))
            i = end
        else:
            out.append(c)
            i += 1
    yield Line(first, line, "".join(out))


def _line_end(text: str, start: int) -> int:
    """Where a // comment that starts at `start` ends: at the first line break not spliced."""
    end = start
    while True:
        end = text.find("\n", end)
        if end < 0:
            return len(text)
        if text[end - 1] != "\\":
            return end
        end += 1


def _literal_end(text: str, quote: int) -> int:
    """Just past the string or character literal opened at `quote` (escapes skipped); an
    unclosed one ends at its line's end, as the preprocessor ends it."""
    i, n = quote + 1, len(text)
    while i < n and text[i] not in (text[quote], "\n"):
        i += 2 if text[i] == "\\" else 1
    return i + 1 if i < n and text[i] == text[quote] else min(i, n)


def _raw_string_end(text: str, quote: int) -> int:
    """Just past the raw string literal whose opening quote is at `quote`: R"delim(...)delim"."""
    paren = text.find("(", quote)
    closing = ")" + text[quote + 1:paren] + '"'
    end = text.find(closing, paren) if paren >= 0 else -1
    return len(text) if end < 0 else end + len(closing)


def _in_number(out: list[str]) -> bool:
    """Whether the token that ends `out` is a number (a pp-number starts with a digit, or a dot
    and a digit): a `'` after it is a digit separator."""
    tail = re.search(r"[\w.']*$", "".join(out[-64:])).group(0)
    return re.match(r"\.?\d", tail) is not None
