#!/usr/bin/env python3
"""Fails if a source file of the workspace is over 700 lines (CONTRIBUTING's rule), or
the README is over 150 (a front page; the manual is in docs/).

    python3 .ci/file_lines.py

Every `.rs` under `src/` of every member of the workspace counts; tests, benches and
examples outside `src/` do not. A file named in `.ci/file_lines.allow` (one path a line,
relative to the root; `#` starts a comment) is reported but does not fail the run. The
list is for a split in progress and is meant to be empty: a path in it that is no longer
over the limit, or no longer exists, fails the run too, so the list only shrinks.
"""
import os
import re
import sys
import tomllib

LIMIT = 700
README_LIMIT = 150
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def members():
    with open(os.path.join(ROOT, "Cargo.toml"), "rb") as f:
        return tomllib.load(f)["workspace"]["members"]


def allowed():
    path = os.path.join(ROOT, ".ci", "file_lines.allow")
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return {re.sub(r"#.*", "", line).strip() for line in f} - {""}


def lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def main():
    over = {}
    for member in members():
        src = os.path.join(ROOT, member, "src")
        for dirpath, _, files in os.walk(src):
            for name in files:
                if name.endswith(".rs"):
                    path = os.path.join(dirpath, name)
                    n = lines(path)
                    if n > LIMIT:
                        over[os.path.relpath(path, ROOT)] = n
    allow = allowed()
    failed = False
    for path, n in sorted(over.items()):
        if path in allow:
            print(f"{path}: {n} lines (allowed for now: .ci/file_lines.allow)")
        else:
            print(f"{path}: {n} lines, over {LIMIT}: split it by concern", file=sys.stderr)
            failed = True
    for path in sorted(allow - over.keys()):
        print(f"{path}: in .ci/file_lines.allow but not over {LIMIT} lines: take it off the list",
              file=sys.stderr)
        failed = True
    readme = lines(os.path.join(ROOT, "README.md"))
    if readme > README_LIMIT:
        print(f"README.md: {readme} lines, over {README_LIMIT}: it is a front page, move the rest "
              "to docs/", file=sys.stderr)
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
