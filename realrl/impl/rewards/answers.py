"""Pure helpers for verifiable rewards: find a final answer in text and compare two answers.

A final answer is taken, in this order, from the last ``\\boxed{...}`` (braces balanced, so
``\\boxed{\\frac{1}{2}}`` keeps its inner braces), from the last GSM8K-style ``#### n`` line, and
optionally from the last number anywhere in the text. Two answers are equal when both read as
numbers with the same exact value (``"1,234"`` == ``"1234"``, ``"$5.00"`` == ``"5"``, ``"3/4"`` ==
``"0.75"`` == ``"\\frac{3}{4}"``, ``"-0"`` == ``"0"``, ``"1e3"`` == ``"1000"``), or else when their
normalised texts are equal (spaces, ``$``, ``\\text{}``, ``\\left``/``\\right`` and a trailing period
removed, lower-cased).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

FALLBACKS = ("last_number", "none")
PERCENT_MODES = ("strip", "fraction")

_BOXED = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])(\s*)")
_GSM8K = re.compile(r"####[ \t]*([^\n]*)")
_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
# a number standing on its own (not the tail of a word or of another number): sign only when
# nothing number-like precedes it, so "12-3" ends in 3 while "x = -3" ends in -3
_NUMBER = re.compile(
    rf"(?<![\w.])(?:(?<![\w)}}\]])-)?(?:{_NUM})(?:[eE][-+]?\d+)?(?:/(?:\d+(?:\.\d+)?))?(?![\w])"
)
_FRAC_TEXT = re.compile(r"-?\\[dt]?frac\s*\{\s*-?[\d.,]+\s*\}\s*\{\s*-?[\d.,]+\s*\}")
_TEXT_MACROS = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\[!,;:]|\\quad|\\qquad|\\left|\\right|\\displaystyle")
_DECIMAL = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d{1,4})?")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d*)?")
_FRACTION = re.compile(r"(-?(?:\d+\.?\d*|\.\d+))/(-?(?:\d+\.?\d*|\.\d+))")
_LATEX_FRAC = re.compile(r"(-?)\\frac\{([^{}]+)\}\{([^{}]+)\}|(-?)\\frac(\d)(\d)")


def braced(text: str, start: int) -> str | None:
    """The text inside the balanced braces that open at ``text[start]``, or None."""
    if start >= len(text) or text[start] != "{":
        return None
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            i += 2  # an escaped brace does not count
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\boxed 5``) whose braces close, else None."""
    for m in reversed(list(_BOXED.finditer(text))):
        if m.end() < len(text) and text[m.end()] == "{":
            content = braced(text, m.end())
        else:
            # "\boxed 5": a bare argument needs the space that ends the macro's name
            bare = re.match(r"[^\s${}]+", text[m.end() :]) if m.group(1) else None
            content = bare.group(0) if bare else None
        if content is not None and content.strip():
            return content.strip()
    return None


def last_gsm8k(text: str) -> str | None:
    """What follows the last ``####`` on its line (GSM8K's answer line), else None."""
    hits = [m.group(1).strip() for m in _GSM8K.finditer(text)]
    if not hits or not hits[-1]:
        return None
    line = hits[-1]
    if parse_number(line) is not None:
        return line
    first = _NUMBER.search(line.replace("$", " "))
    return first.group(0) if first else line


def last_number(text: str) -> str | None:
    """The last number in the text (``1,234``, ``-3``, ``2.5``, ``1e3``, ``3/4``, ``\\frac{1}{2}``)."""
    text = text.replace("\u2212", "-").replace("$", " ")
    best: tuple[int, str] | None = None
    for pattern in (_NUMBER, _FRAC_TEXT):
        for m in pattern.finditer(text):
            if best is None or m.end() > best[0]:
                best = (m.end(), m.group(0))
    return best[1] if best else None


def extract_answer(text: str, fallback: str | None = "last_number") -> str | None:
    """The final answer a completion gives: last ``\\boxed{}``, else ``#### n``, else (with
    ``fallback="last_number"``) the last number; None when there is none."""
    if fallback not in FALLBACKS and fallback is not None:
        raise ValueError(f"fallback must be one of {FALLBACKS} or None, got {fallback!r}")
    found = last_boxed(text)
    if found is None:
        found = last_gsm8k(text)
    if found is None and fallback == "last_number":
        found = last_number(text)
    return found


def reference_answer(reference: str) -> str:
    """A reference as datasets give it: a GSM8K solution ending in ``#### n``, a boxed answer,
    or the answer itself."""
    found = last_boxed(reference)
    if found is None:
        found = last_gsm8k(reference)
    return reference.strip() if found is None else found


def _strip_markup(s: str) -> str:
    s = s.replace("\u2212", "-").replace("\\$", "").replace("$", "").replace("{,}", ",")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\%", "%")
    while True:
        unwrapped = _TEXT_MACROS.sub(r"\1", s)
        if unwrapped == s:
            break
        s = unwrapped
    s = _SPACING.sub("", s)
    s = "".join(s.split())
    while s.endswith("."):
        s = s[:-1]
    return s


def _plain_number(s: str) -> Fraction | None:
    if s.startswith("+"):
        s = s[1:]
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    try:
        if _DECIMAL.fullmatch(s):
            return Fraction(Decimal(s))
        m = _FRACTION.fullmatch(s)
        if m:
            den = Fraction(Decimal(m.group(2)))
            return Fraction(Decimal(m.group(1))) / den if den != 0 else None
    except (InvalidOperation, ValueError, OverflowError):
        return None
    return None


def parse_number(text: str, percent: str = "strip") -> Fraction | None:
    """The exact value of a numeric answer, or None when the text is not a number.

    ``percent="strip"`` reads ``"50%"`` as 50; ``"fraction"`` reads it as 0.5.
    """
    if percent not in PERCENT_MODES:
        raise ValueError(f"percent must be one of {PERCENT_MODES}, got {percent!r}")
    s = _strip_markup(text)
    scale = Fraction(1)
    if s.endswith("%"):
        s = s[:-1]
        scale = Fraction(1, 100) if percent == "fraction" else scale
    if s.startswith("{") and s.endswith("}") and braced(s, 0) == s[1:-1]:
        s = s[1:-1]
    m = _LATEX_FRAC.fullmatch(s)
    if m:
        sign, num, den = m.group(1, 2, 3) if m.group(2) is not None else m.group(4, 5, 6)
        a, b = _plain_number(num), _plain_number(den)
        if a is None or b is None or b == 0:
            return None
        value = a / b
        return (-value if sign else value) * scale
    value = _plain_number(s)
    return None if value is None else value * scale


def normalize_text(text: str) -> str:
    """An answer as text for comparison: markup, spaces and a trailing period gone, lower-cased."""
    return _strip_markup(text).lower()


def answers_match(predicted: str, reference: str, percent: str = "strip", tolerance: float = 0.0) -> bool:
    """Numerically equal (exactly, or within relative ``tolerance``), else equal as normalised text."""
    a, b = parse_number(predicted, percent), parse_number(reference, percent)
    if a is not None and b is not None:
        if a == b:
            return True
        return tolerance > 0 and math.isclose(float(a), float(b), rel_tol=tolerance, abs_tol=tolerance)
    return normalize_text(predicted) == normalize_text(reference)
