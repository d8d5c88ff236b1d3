"""What a candidate's text may ask of the preprocessor, decided on its token stream.

A candidate is hostile input to a compiler that can read files. The rules act on what the compiler
will see: line splicing first, then comments removed (string and character literals respected),
then directives read token by token. Only `#include <name>` of a listed CUDA header, the
conditional and macro directives and a few harmless pragmas are allowed; every other way of
naming a file or running a pragma (macro includes, `#include_next`, `#embed`, `#line`, `_Pragma`,
`__has_include`, token pasting that could assemble those, digraph directives) is refused.
Anything the scanner cannot read unambiguously (trigraphs, raw strings, whitespace after a line
continuation, universal character names or non-ASCII outside literals) is refused too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ALLOWED_INCLUDES = frozenset({
    "cuda_bf16.h", "cuda_fp16.h", "cuda_fp8.h", "cuda_runtime.h", "cuda.h", "cooperative_groups.h",
    "cooperative_groups/reduce.h", "cooperative_groups/memcpy_async.h", "cooperative_groups/scan.h",
    "cuda_pipeline.h", "cuda_pipeline_primitives.h", "cuda_awbarrier.h", "cuda_awbarrier_primitives.h",
    "cuda/barrier", "cuda/pipeline", "cuda/atomic", "cuda/std/cstdint", "cuda/std/limits",
    "cuda/std/type_traits", "cuda/ptx", "mma.h", "stdint.h", "cstdint", "math_constants.h",
})
ALLOWED_DIRECTIVES = frozenset({"define", "undef", "if", "ifdef", "ifndef", "elif", "elifdef", "elifndef", "else",
                                "endif", "pragma", "error", "warning", "include"})
ALLOWED_PRAGMAS = frozenset({"unroll", "nounroll", "once", "push_macro", "pop_macro", "nv_diag_suppress",
                             "nv_diag_default", "nv_diag_warning", "nv_diag_error", "diag_suppress", "diag_default",
                             "diag_warning"})
FORBIDDEN_IDENTIFIERS = frozenset({"_Pragma", "__pragma", "__has_include", "__has_include_next", "__has_embed"})
RAW_STRING_PREFIXES = frozenset({"R", "u8R", "uR", "UR", "LR"})

TRIGRAPH = re.compile(r"\?\?[=/'()!<>\-]")
SPACE_AFTER_CONTINUATION = re.compile(r"\\[ \t\f\v]+\r?\n")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PP_NUMBER = re.compile(r"\.?[0-9](?:[eEpP][+-]|'[0-9A-Za-z_]|[0-9A-Za-z_.])*")
HEADER_NAME = re.compile(r"\s*<([A-Za-z0-9_./]+)>\s*$")


class SourceRuleError(ValueError):
    """The source asks the preprocessor for something a candidate may not have (line numbers are the file's)."""


@dataclass
class LogicalLine:
    """One line as the preprocessor sees it (continuations joined, comments gone) and where it starts."""

    number: int
    text: str


def check_source(source: str, header_macros: frozenset[str] = frozenset()) -> None:
    """Raise SourceRuleError on the first rule the source breaks; return quietly otherwise. `header_macros`
    are macros of the includable headers that would undo the rules (sandbox.header_macros); using one is
    refused like the operator it stands for."""
    _check_raw_text(source)
    for line in logical_lines(source):
        _check_line(line, header_macros)


def _check_raw_text(source: str) -> None:
    for pattern, what in ((TRIGRAPH, "trigraph sequences are refused"),
                          (SPACE_AFTER_CONTINUATION, "whitespace after a line-continuation backslash is refused")):
        m = pattern.search(source)
        if m:
            raise SourceRuleError(f"line {_line_of(source, m.start())}: {what}")
    if "\0" in source:
        raise SourceRuleError(f"line {_line_of(source, source.index(chr(0)))}: NUL bytes are refused")
    bare_cr = re.search(r"\r(?!\n)", source)
    if bare_cr:
        raise SourceRuleError(f"line {_line_of(source, bare_cr.start())}: a carriage return without a line feed "
                              "is refused")


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def logical_lines(source: str) -> list[LogicalLine]:
    """Translation phases 2-3 as far as the rules need: splice continuations, blank out comments.

    Literals are kept verbatim (their content can never be a directive); an unterminated comment or
    literal is an error, as it would be for the compiler.
    """
    physical = source.replace("\r\n", "\n").split("\n")
    joined: list[LogicalLine] = []
    pending, start = "", 0
    for i, text in enumerate(physical, 1):
        if not pending:
            start = i
        if text.endswith("\\"):
            pending += text[:-1]
            continue
        joined.append(LogicalLine(start, pending + text))
        pending = ""
    if pending:
        joined.append(LogicalLine(start, pending))
    return _strip_comments(joined)


def _strip_comments(lines: list[LogicalLine]) -> list[LogicalLine]:
    """Comments become one space. A block comment that spans lines joins them, as it does for the
    preprocessor: `# /*` newline `*/ include "x"` is one directive line, `#   include "x"`."""
    out: list[LogicalLine] = []
    in_block = False
    block_start = 0
    kept: list[str] = []
    number = 0
    for line in lines:
        text, i = line.text, 0
        if not in_block:
            kept, number = [], line.number
        while i < len(text):
            if in_block:
                end = text.find("*/", i)
                if end < 0:
                    i = len(text)
                    continue
                in_block, i = False, end + 2
                kept.append(" ")
                continue
            if text.startswith("/*", i):
                in_block, block_start, i = True, line.number, i + 2
            elif text.startswith("//", i):
                break
            else:
                token, i = _lex(text, i, line.number)
                kept.append(token)
        if not in_block:
            out.append(LogicalLine(number, "".join(kept)))
    if in_block:
        raise SourceRuleError(f"line {block_start}: unterminated /* comment")
    return out


def _literal_end(text: str, i: int, number: int) -> int:
    quote, j = text[i], i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == quote:
            return j + 1
        j += 1
    raise SourceRuleError(f"line {number}: unterminated {'string' if quote == chr(34) else 'character'} literal")


def _lex(text: str, i: int, number: int) -> tuple[str, int]:
    """The pp-token (or the single character) at `i` of a line and where it ends: a literal, a pp-number, an
    identifier (a raw-string prefix is refused), a punctuator the rules care about (longest first)."""
    c = text[i]
    if c in "\"'":
        end = _literal_end(text, i, number)
        return text[i:end], end
    if _digit(c) or (c == "." and i + 1 < len(text) and _digit(text[i + 1])):
        m = PP_NUMBER.match(text, i)
        return m.group(0), m.end()
    m = IDENT.match(text, i)
    if m:
        if m.group(0) in RAW_STRING_PREFIXES and text.startswith('"', m.end()):
            raise SourceRuleError(f"line {number}: raw string literals are refused")
        return m.group(0), m.end()
    punct = next((p for p in ("%:%:", "##", "%:", "<:", ":>", "<%", "%>") if text.startswith(p, i)), c)
    return punct, i + len(punct)


def _digit(c: str) -> bool:
    """An ASCII digit (str.isdigit also takes '²' and '٣', which start no pp-number)."""
    return "0" <= c <= "9"


def _tokens(text: str, number: int) -> list[str]:
    """pp-tokens of a comment-free line: identifiers, numbers, literals and punctuators."""
    tokens, i = [], 0
    while i < len(text):
        token, i = _lex(text, i, number)
        if not token.isspace():
            tokens.append(token)
    return tokens


def _check_line(line: LogicalLine, header_macros: frozenset[str]) -> None:
    n, text = line.number, line.text
    tokens = _tokens(text, n)
    outside_literals = "".join(t for t in tokens if t[0] not in "\"'")   # literals found by the one lexer
    if re.search(r"\\[uU]", outside_literals):
        raise SourceRuleError(f"line {n}: universal character names outside literals are refused")
    if any(ord(ch) > 127 for ch in outside_literals):
        raise SourceRuleError(f"line {n}: non-ASCII characters outside comments and literals are refused")
    for tok in tokens:
        if tok in FORBIDDEN_IDENTIFIERS:
            raise SourceRuleError(f"line {n}: {tok} is refused (it can read files or run pragmas)")
        if tok in header_macros:
            raise SourceRuleError(f"line {n}: {tok} is refused: this CUDA header macro pastes tokens, runs a "
                                  "pragma or tests for a file")
        if tok in ("##", "%:%:"):
            raise SourceRuleError(f"line {n}: token pasting (##) is refused (it can assemble _Pragma or "
                                  "__has_include)")
        if tok in ("%:",):
            raise SourceRuleError(f"line {n}: the digraph %: is refused; write # instead")
    if tokens and tokens[0] == "#":
        _check_directive(n, text, tokens[1:])


def _check_directive(n: int, text: str, rest: list[str]) -> None:
    if not rest:
        return   # the null directive
    name = rest[0]
    if name not in ALLOWED_DIRECTIVES:
        raise SourceRuleError(f"line {n}: #{name} is refused (allowed: "
                              f"{', '.join('#' + d for d in sorted(ALLOWED_DIRECTIVES))})")
    if name == "include":
        after = text.split("include", 1)[1]
        m = HEADER_NAME.match(after)
        if not m:
            raise SourceRuleError(f"line {n}: only #include <header> of a listed CUDA header is allowed "
                                  "(no quoted or macro includes)")
        if m.group(1) not in ALLOWED_INCLUDES:
            raise SourceRuleError(f"line {n}: #include <{m.group(1)}> is not on the allow-list "
                                  f"({', '.join(sorted(ALLOWED_INCLUDES))})")
    elif name == "pragma":
        pragma = rest[1] if len(rest) > 1 else ""
        if pragma not in ALLOWED_PRAGMAS:
            allowed = ", ".join(sorted(ALLOWED_PRAGMAS))
            raise SourceRuleError(f"line {n}: #pragma {pragma} is refused (allowed: {allowed})")
