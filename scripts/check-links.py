#!/usr/bin/env python3
"""Every relative link in the repository's Markdown files resolves: the file or directory
exists, and a `#anchor` names a heading of the target page (GitHub's anchors). Web links are
not fetched. Run by scripts/test.sh with the lints; takes well under a second.

    python3 scripts/check-links.py [FILE.md ...]     # default: every Markdown file in git
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
CODE = re.compile(r"`+[^`]*`+")


def markdown_files():
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
            cwd=ROOT, check=True, capture_output=True, text=True,
        ).stdout
        return [f for f in out.splitlines() if os.path.exists(os.path.join(ROOT, f))]
    except (OSError, subprocess.CalledProcessError):
        docs = os.path.join(ROOT, "docs")
        names = [f for f in os.listdir(ROOT) if f.endswith(".md")]
        if os.path.isdir(docs):
            names += ["docs/" + f for f in os.listdir(docs) if f.endswith(".md")]
        return names


def lines_outside_code(text):
    """The lines of `text` that are not in a fenced code block, with code spans blanked."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, CODE.sub("", line)


def slug(heading):
    """GitHub's anchor for a heading: formatting dropped, lower case, punctuation removed,
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in "-_ ")
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen, found = {}, set()
        with open(path, encoding="utf-8") as f:
            fenced = False
            for line in f:
                if FENCE.match(line):
                    fenced = not fenced
                    continue
                m = None if fenced else re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
                if m:
                    base = slug(m.group(1))
                    n = seen.get(base, 0)
                    seen[base] = n + 1
                    found.add(base if n == 0 else f"{base}-{n}")
        _anchors[path] = found
    return _anchors[path]


def check(md):
    problems = []
    path = os.path.join(ROOT, md)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for n, line in lines_outside_code(text):
        targets = [m.group(1) for m in INLINE.finditer(line)]
        ref = REFDEF.match(line)
        if ref:
            targets.append(ref.group(1))
        for target in targets:
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            where = f"{md}:{n}: {target}"
            if not os.path.exists(dest):
                problems.append(f"{where}: no such file")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                problems.append(f"{where}: no heading with that anchor in {os.path.relpath(dest, ROOT)}")
    return problems


def main(args):
    files = args or markdown_files()
    problems = [p for md in files for p in check(md)]
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"{len(problems)} broken link(s) in {len(files)} Markdown files", file=sys.stderr)
        return 1
    print(f"links: {len(files)} Markdown files, every relative link resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
