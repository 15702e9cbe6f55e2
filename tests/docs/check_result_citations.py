#!/usr/bin/env python3
"""Every figure the docs quote next to a committed result file is in that file (docs/performance.md, "Citing results").

usage: check_result_citations.py REPO_ROOT [--verbose]

Scanned: README.md, docs/**/*.md, plugins/**/*.md. A citation is `bench/results/<file>` in the text. Its context:
  - in a table row (a line starting with `|`): that row;
  - otherwise its paragraph (the run of non-blank lines around it; each list item is a paragraph of its own) and,
    when the next block after it is a table, that whole table (the rows a paragraph introduces).
A figure is a number written with a decimal point (1.33, 0.0875) or followed by a unit (448 ms, 17,396 tokens/s,
49 %, 1.6x); not one inside `code`, a link target, a path, a date or a name (sm_90, H200, qwen3-30b), nor a goal or
a bound (after "goal" or ≤ ≥ < >: "goal ≤ 0.10 ms", "goal 2×"). A figure
matches a cited file when the file holds a number that rounds to it at the figure's precision (448 matches 447.8;
375.5 matches 375.51), read anywhere in the file's text; a percentage may also be a stored fraction times 100
(1.7 % matches 0.0167), a time may be stored in the next larger or smaller unit (15.6 µs matches 0.015648 ms), and a
ratio (x or ×) may also be the quotient of two numbers of the same file. Each figure of a
context must match at least one of the files cited in it.
Also: every cited file exists, and every bench/results/*.json holds "device" and "date" (for a list: each element).
Exit 1 with one line per problem."""
import glob
import json
import os
import re
import sys

# A unit after a number makes it a figure; a ratio's x or × must touch the number ("1.33x", not "2 x 4096").
UNITS = r"(?:\s?(?:ms|µs|us|ns|s|%|GB|GiB|MB|MiB|KiB|TB/s|GB/s|TFLOP/s|TFLOPS|images/s|tokens/s|tok/s|launches)|[x×])"
CITE = re.compile(r"bench/results/([A-Za-z0-9._-]+\.(?:json|txt|md|log))")
# A number: digits with optional thousands commas and a fraction. Not glued to a letter, digit, _, -, ., /, : or
# `=` before it (names, dates, versions, paths, key=value), nor to a letter, digit, _ or `.digit` after it.
NUM = re.compile(r"(?<![\w.\-/:=])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?![\w]|\.\d)")


LIST_ITEM = re.compile(r"\s*(?:[-*+]|\d+\.)\s")


def blocks(lines):
    """[(start, end)] of paragraphs: runs of non-blank lines, a list item starting a new one."""
    out, start = [], None
    for i, l in enumerate(lines + [""]):
        if start is not None and (not l.strip() or (LIST_ITEM.match(l) and not lines[start].lstrip().startswith("|"))):
            out.append((start, i))
            start = None
        if l.strip() and start is None:
            start = i
    return out


def is_table(lines, b):
    return all(lines[i].lstrip().startswith("|") for i in range(*b))


def strip_text(text):
    text = re.sub(r"`[^`]*`", " ", text)                 # code spans
    text = re.sub(r"\]\([^)]*\)", "]", text)             # link targets
    text = re.sub(r"\S*/\S*\.(?:json|txt|md|log|py|sh|cpp|toml)\S*", " ", text)  # paths
    text = re.sub(r"\b\d{4}-\d{2}-\d{2}\b", " ", text)   # dates
    return text


# A goal or a bound is not a measurement: "goal ≤ 0.10 ms", "goal 2×", "< 1 %".
TARGET = re.compile(r"(?:goal:?|[≤≥<>]=?)\s*[+−-]?$")


def figures(text):
    out = []
    plain = strip_text(text)
    for m in NUM.finditer(plain):
        whole, frac = m.group(1).replace(",", ""), m.group(2) or ""
        if TARGET.search(plain[max(0, m.start() - 12):m.start()]):
            continue
        rest = plain[m.end():]
        unit = re.match(UNITS + r"(?!\w)", rest)
        if not frac and not unit:
            continue
        out.append((whole + frac, len(frac) - 1 if frac else 0, unit.group(0).strip() if unit else ""))
    return out


def numbers_in(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    vals = set()
    for m in re.finditer(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", text.replace(",", "")):
        try:
            vals.add(abs(float(m.group(0))))
        except ValueError:
            pass
    return sorted(vals)


def matches(fig, decimals, unit, vals):
    f = float(fig)
    tol = 0.5 * 10 ** -decimals + 1e-12
    if any(abs(v - f) <= tol for v in vals):
        return True
    if unit == "%" and any(abs(v * 100 - f) <= tol for v in vals):
        return True
    if unit in ("ms", "µs", "us", "ns", "s") and any(abs(v * k - f) <= tol for v in vals for k in (1e3, 1e-3)):
        return True
    if unit in ("x", "×"):
        nz = [v for v in vals if v > 0]
        return any(abs(a / b - f) <= tol for a in nz for b in nz if a != b)
    return False


def main():
    root = sys.argv[1]
    verbose = "--verbose" in sys.argv
    problems = []
    docs = [os.path.join(root, "README.md")]
    docs += sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))
    docs += sorted(glob.glob(os.path.join(root, "plugins", "**", "*.md"), recursive=True))
    cache = {}
    for doc in docs:
        rel = os.path.relpath(doc, root)
        lines = open(doc, encoding="utf-8").read().split("\n")
        bl = blocks(lines)
        contexts = []  # (first line, [text lines], [cited files])
        for k, b in enumerate(bl):
            if is_table(lines, b):
                for i in range(*b):
                    cited = CITE.findall(lines[i])
                    if cited:
                        contexts.append((i, [lines[i]], cited))
                continue
            text = "\n".join(lines[b[0]:b[1]])
            cited = CITE.findall(text)
            if not cited:
                continue
            ctx = [text]
            if k + 1 < len(bl) and is_table(lines, bl[k + 1]):
                ctx += [lines[i] for i in range(*bl[k + 1]) if not CITE.findall(lines[i])]
            contexts.append((b[0], ctx, cited))
        for line, ctx, cited in contexts:
            vals = []
            for c in dict.fromkeys(cited):
                path = os.path.join(root, "bench", "results", c)
                if not os.path.isfile(path):
                    problems.append(f"{rel}:{line + 1}: cites bench/results/{c}, which does not exist")
                    continue
                if path not in cache:
                    cache[path] = numbers_in(path)
                vals += cache[path]
            if not vals:
                continue
            for text in ctx:
                for fig, dec, unit in figures(text):
                    if not matches(fig, dec, unit, vals):
                        problems.append(f"{rel}:{line + 1}: {fig}{(' ' + unit) if unit else ''} is in none of "
                                        + ", ".join(f"bench/results/{c}" for c in dict.fromkeys(cited)))
                    elif verbose:
                        print(f"ok {rel}:{line + 1}: {fig} {unit}")
    for path in sorted(glob.glob(os.path.join(root, "bench", "results", "*.json"))):
        rel = os.path.relpath(path, root)
        try:
            data = json.load(open(path))
        except ValueError as e:
            problems.append(f"{rel}: not JSON ({e})")
            continue
        items = data if isinstance(data, list) else [data]
        for key in ("device", "date"):
            if not all(isinstance(i, dict) and key in i for i in items):
                problems.append(f"{rel}: no \"{key}\" inside (say where and when it was measured)")
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s)" if problems else "every cited figure is in its result file")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
