#!/usr/bin/env python3
"""Checks every relative link of the project's pages (README.md and docs/**/*.md): the file or
directory it points to exists, and a '#anchor' names a heading of the target page.

What counts as a link: inline links and images, [text](target) and ![alt](target) (an optional
"title" after the target is ignored), and reference definitions, [name]: target. Links inside
fenced code blocks and inline code spans are text, not links. Targets with a scheme (https:,
mailto:, ...) are not checked; a target starting with '/' is an error (it would mean the root
of the file system, or of the web site, not of the repository). A target is resolved against
the directory of the page it is in, as GitHub does. '#anchor' alone refers to the page itself.

Anchors follow GitHub's rule for headings: lower case; inline code, emphasis and link syntax
reduced to their text; every character that is not a letter, digit, space, '-' or '_' dropped;
spaces turned into '-'; a repeated heading gets '-1', '-2', ... Explicit <a name="x"> / id="x"
anchors count too. Anchors into files other than Markdown pages (e.g. a line of a header) are
not checked.

Usage: scripts/check_links.py [ROOT] [FILE.md ...]
  ROOT      the tree (default: the repository this script is in)
  FILE.md   pages to check, relative to ROOT (default: README.md and docs/**/*.md)
Prints "FILE:LINE: broken link 'TARGET': REASON" for each broken link and exits 1 if there is
one; exits 0 with a one-line summary otherwise.
"""

import pathlib
import re
import sys
import urllib.parse

FENCE_OPEN = re.compile(r"^\s*(`{3,}|~{3,})([^`]*)$")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"|\sid=\"([^\"]+)\"")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def text_lines(text):
    """(line number, line) for each line outside fenced code blocks, inline code removed."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        if fence:
            if re.match(r"^\s*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$", line):
                fence = None
            continue
        opened = FENCE_OPEN.match(line)
        if opened:
            fence = opened.group(1)
            continue
        yield number, CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def slug(heading):
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"`([^`]*)`", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(text):
    found, seen = set(), {}
    fence = None
    for line in text.split("\n"):
        if fence:
            if re.match(r"^\s*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$", line):
                fence = None
            continue
        opened = FENCE_OPEN.match(line)
        if opened:
            fence = opened.group(1)
            continue
        for m in HTML_ANCHOR.finditer(line):
            found.add(m.group(1) or m.group(2))
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def pages(root):
    out = [root / "README.md"] if (root / "README.md").exists() else []
    docs = root / "docs"
    if docs.is_dir():
        out += sorted(docs.rglob("*.md"))
    return out


def check_page(root, page, anchor_cache):
    rel = page.relative_to(root).as_posix()
    text = page.read_text(encoding="utf-8", errors="replace")
    problems, count = [], 0
    for number, line in text_lines(text):
        targets = [m.group(1) for m in INLINE_LINK.finditer(line)]
        ref = REFERENCE_DEF.match(line)
        if ref:
            targets.append(ref.group(1))
        for target in targets:
            count += 1
            reason = broken(root, page, target, anchor_cache)
            if reason:
                problems.append(f"{rel}:{number}: broken link '{target}': {reason}")
    return problems, count


def broken(root, page, target, anchor_cache):
    if not target:
        return "empty target"
    if SCHEME.match(target):
        return None
    if target.startswith("/"):
        return "absolute path; write it relative to the page"
    path_part, _, anchor = target.partition("#")
    path_part = urllib.parse.unquote(path_part)
    resolved = (page.parent / path_part).resolve() if path_part else page.resolve()
    try:
        resolved.relative_to(root.resolve())
    except ValueError:
        return "points outside the repository"
    if not resolved.exists():
        return f"{resolved.relative_to(root.resolve()).as_posix()} does not exist"
    if anchor and resolved.suffix == ".md" and resolved.is_file():
        if resolved not in anchor_cache:
            anchor_cache[resolved] = anchors(resolved.read_text(encoding="utf-8",
                                                                errors="replace"))
        if urllib.parse.unquote(anchor) not in anchor_cache[resolved]:
            where = resolved.relative_to(root.resolve()).as_posix()
            return f"no heading with anchor '#{anchor}' in {where}"
    return None


def main(argv):
    root = pathlib.Path(argv[0]) if argv else pathlib.Path(__file__).resolve().parent.parent
    root = root.resolve()
    files = [root / f for f in argv[1:]] or pages(root)
    problems, links, cache = [], 0, {}
    for page in files:
        found, count = check_page(root, page, cache)
        problems += found
        links += count
    for p in problems:
        print(p)
    if problems:
        print(f"check_links: {len(problems)} of {links} links in {len(files)} pages are broken")
        return 1
    print(f"check_links: {links} links in {len(files)} pages resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
