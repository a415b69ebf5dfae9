"""The samples of terminal output in README.md and docs/ (each ```text block), and how a run's output is held
against one: both texts are normalised the same way (the checkout's folder reads `...`, timings `<t>s`,
result-file timestamps `<ts>`, pytest's `=== text ===` banners lose their padding); a sample is a list of
segments separated by lines of `...`, each of which must appear in the output as consecutive lines (blank lines
aside), the segments in order."""
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


def find_in_order(output: list[str], parts: list[list[str]]) -> str | None:
    """None when every part appears in `output` as consecutive lines, in order; else the first part that does not."""
    start = 0
    for part in parts:
        at = next((i for i in range(start, len(output) - len(part) + 1) if output[i:i + len(part)] == part), None)
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
