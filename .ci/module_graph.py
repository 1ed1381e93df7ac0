#!/usr/bin/env python3
"""Prints the module graph of a crate and fails if two modules import each other.

    python3 .ci/module_graph.py idem-runtime/src idem-macros/src

Each file module is a node (`lib.rs` is `crate`). Every `crate::`, `super::` and
`self::` path in code (use declarations and inline paths; comments and strings are
skipped) is an edge to the deepest module the path names; a name re-exported by the
crate root counts as an edge to the module that defines it. Edges are compared between
siblings: a reference from `a::x` to `b::y` is an edge `a -> b` at the level where they
part, and a module using its own parent or child is not an edge (a parent declares its
children). A cycle among siblings at any level is an error.
"""
import os
import re
import sys


def modules(src):
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("lib", "main", "mod"):
                parts = parts[:-1]
            # `#[path = "private/mod.rs"] mod __private;` style renames
            mods[tuple(parts)] = os.path.join(dirpath, f)
    return mods


def code_of(path):
    text = open(path).read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r#*"(?:.|\n)*?"#*', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    text = re.sub(r"//[^\n]*", "", text)
    # unit tests are not part of the module graph
    text = re.split(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)[0]
    return text


def flatten(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]"""
    tree = tree.strip()
    m = re.match(r"^(.*?)\{(.*)\}$", tree, flags=re.S)
    if not m:
        return [re.sub(r"\s+as\s+\w+$", "", tree).strip()]
    prefix, inner = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for part in parts if part.strip() for p in flatten(prefix + part.strip())]


def paths_in(code):
    out = []
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        out += flatten(m.group(1))
    for m in re.finditer(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)", code):
        out.append(m.group(1))
    return [p for p in out if p.split("::")[0] in ("crate", "super", "self")]


def resolve(mod, path, mods, root_names):
    segs = path.split("::")
    if segs[0] == "crate":
        base, rest = (), segs[1:]
    else:
        base = list(mod)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
        base, rest = tuple(base), segs
    target = base
    for s in rest:
        if target + (s,) in mods:
            target = target + (s,)
        else:
            if target == () and s in root_names:
                return root_names[s]
            break
    return target


def root_reexports(mods):
    names = {}
    code = code_of(mods[()])
    for m in re.finditer(r"\bpub\s+use\s+([^;]+);", code):
        for p in flatten(m.group(1)):
            segs = p.split("::")
            if segs[0] == "crate":
                segs = segs[1:]
            target = ()
            for s in segs[:-1]:
                if target + (s,) in mods:
                    target = target + (s,)
            if target:
                names[segs[-1]] = target
    return names


def graph(src):
    mods = modules(src)
    # `#[path = "x/mod.rs"] mod y;`: the file's module is named y
    lib = open(mods[()]).read()
    for m in re.finditer(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:pub\s+)?mod\s+(\w+)', lib):
        p = m.group(1)[:-3].split("/")
        if p[-1] == "mod":
            p = p[:-1]
        for k in [k for k in mods if k[: len(p)] == tuple(p)]:
            mods[(m.group(2),) + k[len(p):]] = mods.pop(k)
    names = root_reexports(mods)
    edges = {m: set() for m in mods}
    for mod, path in mods.items():
        for p in paths_in(code_of(path)):
            t = resolve(mod, p, mods, names)
            if t != mod:
                edges[mod].add(t)
    return mods, edges


def sibling_edges(edges):
    out = set()
    for a, targets in edges.items():
        for b in targets:
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            if n == len(a) or n == len(b):
                continue  # parent and child
            out.add((a[: n + 1], b[: n + 1]))
    return out


def cycles(pairs):
    adj = {}
    for a, b in pairs:
        adj.setdefault(a, set()).add(b)
    found, state = [], {}

    def visit(n, stack):
        state[n] = 1
        stack.append(n)
        for m in sorted(adj.get(n, ())):
            if state.get(m) == 1:
                found.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m, stack)
        stack.pop()
        state[n] = 2

    for n in sorted(adj):
        if n not in state:
            visit(n, [])
    return found


def name(m):
    return "::".join(("crate",) + m)


def main():
    bad = False
    for src in sys.argv[1:]:
        mods, edges = graph(src)
        print(f"## {src}\n")
        for m in sorted(mods):
            deps = sorted(name(t) for t in edges[m] if t != ())
            print(f"- `{name(m)}` -> {', '.join(f'`{d}`' for d in deps) or '(none)'}")
        found = cycles(sibling_edges(edges))
        print()
        for c in found:
            bad = True
            line = f"CYCLE in {src}: " + " -> ".join(name(m) for m in c)
            print(line)
            print(line, file=sys.stderr)
        if not found:
            print("No cycles.")
        print()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
