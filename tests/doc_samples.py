"""The samples of terminal output in README.md and docs/ (each ```text block), and how a run's output is held
against one: both texts are normalised the same way (the checkout's folder reads `...`, timings `<t>s`,
result-file timestamps `<ts>`, pytest's `=== text ===` banners lose their padding); a sample is a list of
segments separated by lines of `...`, each of which must appear in the output as consecutive lines (blank lines
aside), the segments in order. A line of a sample matches an output line that is the same but for decimal numbers
(a token with a fraction part) within a relative 1e-3 of the page's: the page shows a host's value, and the last
digits of a bench's fp32 sum are the host's BLAS's choice (another CPU vendor's kernels sum in another order).
Counts, indices, shapes and words are held exactly."""
from __future__ import annotations

import re

from tests.helpers import ROOT


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S)


def normalise(text: str, folder: str) -> list[str]:
    text = text.replace(folder, "...")
    text = re.sub(r"(?<!\d)\d{14}(?!\d)", "<ts>", text)  # the result files' timestamps
    text = re.sub(r" in \d+(\.\d+)?s( \(\d+:\d\d:\d\d\))?", " in <t>s", text)
    lines = [re.sub(r"^=+ (.*?) =+$", r"== \1 ==", re.sub(r"^_+ (.*?) _+$", r"__ \1 __", line.rstrip()))
             for line in text.splitlines()]
    return [line for line in lines if line]


def segments(sample: list[str]) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for line in sample:
        if line == "...":
            parts.append([])
        else:
            parts[-1].append(line)
    return [p for p in parts if p]


DECIMAL = re.compile(r"(?<![\w.])([-+]?\d+\.\d+(?:e[-+]?\d+)?)(?![\w.])")
REL = 1e-3  # decimals agree to three significant digits: every figure the samples discuss


def same_line(page: str, output: str) -> bool:
    """The page's line and the output's: equal, or equal but for decimals within REL (column padding aside)."""
    if page == output:
        return True
    a, b = DECIMAL.split(page), DECIMAL.split(output)  # text, decimal, text, ..., text
    if len(a) != len(b) or [" ".join(t.split()) for t in a[::2]] != [" ".join(t.split()) for t in b[::2]]:
        return False
    return all(abs(float(x) - float(y)) <= REL * max(abs(float(x)), abs(float(y))) for x, y in zip(a[1::2], b[1::2]))


def find_in_order(output: list[str], parts: list[list[str]]) -> str | None:
    """None when every part appears in `output` as consecutive lines, in order; else the first part that does not."""
    start = 0
    for part in parts:
        at = next((i for i in range(start, len(output) - len(part) + 1)
                   if all(same_line(p, o) for p, o in zip(part, output[i:i + len(part)]))), None)
        if at is None:
            return "\n".join(part)
        start = at + len(part)
    return None


def missing_from(output: str, page: str, index: int, folder: str = "<here>", variable: tuple[str, ...] = ()) -> \
        str | None:
    """None when `page`'s ```text block `index` is in `output`; else its first segment that is not. What matches a
    pattern of `variable` (a port, a duration) reads `<v>` in both."""
    sample = code_blocks((ROOT / page).read_text(encoding="utf-8"), "text")[index]

    def plain(text: str) -> list[str]:
        for pattern in variable:
            text = re.sub(pattern, "<v>", text)
        return normalise(text, folder)

    return find_in_order(plain(output), segments(plain(sample)))
