#!/usr/bin/env python3
"""The library's layering, checked: every `crate::`/`super::` path in boltccl/src against the
layer order that docs/architecture.md declares.

    scripts/check-layers.py            # fail (exit 1) on any edge against the order or any cycle
    scripts/check-layers.py --report   # print the module graph's import circles and edges
    scripts/check-layers.py --layers F # check against the Layers block of F instead

The order is the fenced block after the heading "Layers" in docs/architecture.md: one layer a
line, lowest first, each a list of modules (`transport/` names the directory and every file in
it, `transport` alone only `transport/mod.rs`; `group+request` one concept in two files, which
may use each other). A module may use modules of its own
layer or of lower layers, never higher ones; and the file-level graph has no circle at all (a
parent module declaring `mod child;` is containment, not an edge; test modules are not
counted). Every file in boltccl/src must belong to exactly one layer, so a new module has to
be placed in the picture before it builds into the library.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "boltccl", "src")
DOC = os.path.join(ROOT, "docs", "architecture.md")


def modules():
    """{module path ('transport::shm::setup', '' for lib.rs): file}"""
    out = {}
    for dirpath, _, files in os.walk(SRC):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), SRC)[:-3].split(os.sep)
            if rel[-1] == "mod":
                rel = rel[:-1]
            if rel == ["lib"]:
                rel = []
            out["::".join(rel)] = os.path.join(dirpath, f)
    return out


def lex(text):
    """The code without comments, string and char literals (each literal left as `""`)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            i = text.find("*/", i) + 2
        elif c == "r" and re.match(r'r#*"', text[i:i + 8]) and not re.match(r"\w", text[i - 1:i] or " "):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            i = text.find('"' + hashes, text.index('"', i) + 1) + 1 + len(hashes)
            out.append('""')
        elif c == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12]):
            i = text.index("'", i + 2) + 1
            out.append('""')
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip(text):
    """The code without comments, literals and `#[cfg(test)] mod ... { }` blocks."""
    text = lex(text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while depth and j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def expand(path):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e'] (prefixes kept for `self`)."""
    m = re.match(r"^([\w:]*?)::\{(.*)\}$", path, re.S)
    if not m:
        return [path]
    head, body = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        p = re.sub(r"\s+", "", p)
        p = re.sub(r"\bas\w+$", "", p)
        if not p:
            continue
        if p == "self":
            out.append(head)
        else:
            out.extend(expand(head + "::" + p))
    return out


def reexports(mods):
    """{(module, item): module the item is defined in} for `pub use child::...` facades."""
    out = {}
    for mod, file in mods.items():
        text = strip(open(file, encoding="utf-8").read())
        for m in re.finditer(r"\bpub(?:\([a-z]+\))?\s+use\s+([^;]*);", text):
            for p in expand(re.sub(r"\s+", "", m.group(1))):
                segs = p.split("::")
                if segs[0] in ("crate", "super", "self"):
                    continue
                child = (mod + "::" if mod else "") + segs[0]
                if child in mods:
                    out[(mod, segs[-1])] = ("self::" + p, mod)
    return out


def resolve(mods, here, p, seen=0):
    """The module (file) a path names: its longest module prefix, through re-exports."""
    segs = p.split("::")
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] == "super":
        base, segs = here[:-1], segs[1:]
        while segs and segs[0] == "super":
            base, segs = base[:-1], segs[1:]
    else:  # self
        base, segs = list(here), segs[1:]
    target, best, rest = list(base), "::".join(base), segs
    for i, s in enumerate(segs):
        target.append(s)
        if "::".join(target) in mods:
            best, rest = "::".join(target), segs[i + 1:]
    if best not in mods:
        return None
    if rest and (best, rest[0]) in REEXPORTS and seen < 8:
        path, owner = REEXPORTS[(best, rest[0])]
        return resolve(mods, owner.split("::") if owner else [], path, seen + 1)
    return best


REEXPORTS = {}


def edges(mods):
    """{(from module, to module)} at file level."""
    found = set()
    for mod, file in mods.items():
        text = strip(open(file, encoding="utf-8").read())
        # A file is a module; `super` is its parent (for mod.rs files, too: the module is the
        # directory). Inside an inline `mod name { }`, paths are relative to that module, but
        # the edge is the file's.
        inline = []
        for m in re.finditer(r"\bmod\s+(\w+)\s*\{", text):
            depth, j = 1, m.end()
            while depth and j < len(text):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
            inline.append((m.start(), j, m.group(1)))

        def scope(pos):
            return (mod.split("::") if mod else []) + [n for a, b, n in inline if a <= pos < b]

        paths = []
        for m in re.finditer(r"\b(pub(?:\([a-z]+\))?\s+)?use\s+([^;]*);", text):
            here = scope(m.start())
            for p in expand(re.sub(r"\s+", "", m.group(2))):
                first = p.split("::")[0]
                if first in ("crate", "super", "self"):
                    paths.append((here, p, m.group(1)))
                elif "::".join(here + [first]) in mods:
                    paths.append((here, "self::" + p, m.group(1)))
        for m in re.finditer(r"(?<![\w:])((?:crate|super)(?:::\w+)+)", text):
            paths.append((scope(m.start()), m.group(1), None))
        for m in re.finditer(r"(?<![\w:])([a-z_]\w*)(?:::\w+)+", text):
            here = scope(m.start())
            if m.group(1) not in ("crate", "super", "self") and "::".join(here + [m.group(1)]) in mods:
                if not re.match(r"(pub(\([a-z]+\))?\s+)?(use|mod)\b", text[text.rfind("\n", 0, m.start()) + 1:m.start()].strip() or "x"):
                    paths.append((here, "self::" + m.group(0), None))
        for here, p, public in paths:
            target = resolve(mods, here, p)
            if target is None or target == mod:
                continue
            # A parent's `pub use child::Item` is its facade, not a use of the child.
            if public and target.startswith(mod + "::" if mod else ""):
                continue
            found.add((mod, target))
    return found


def scc(nodes, es):
    """Tarjan: the strongly connected components with more than one module."""
    adj = {n: sorted(b for a, b in es if a == n) for n in nodes}
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for n in sorted(nodes):
        if n not in index:
            visit(n)
    return comps


def declared(doc):
    """The layers, lowest first, from docs/architecture.md: [[module or directory, ...], ...]."""
    text = open(doc, encoding="utf-8").read()
    m = re.search(r"^#+ Layers\s*$.*?^```[a-z]*\n(.*?)^```", text, re.S | re.M)
    if not m:
        sys.exit(f"{DOC}: no fenced block under a 'Layers' heading")
    layers = []
    for line in m.group(1).splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        # "N  name name name" or "name name" (a leading number or label before ':' is ignored)
        line = re.sub(r"^\s*\d+\s*[.:]?\s*", "", line)
        line = line.split(":", 1)[-1] if ":" in line else line
        layers.append([w.strip(",") for w in line.split() if w.strip(",")])
    return layers


def entries(layers):
    """[(layer index, entry, unit)]: `a+b` names one concept in two files (a unit: circles
    inside it are allowed), `dir/` a directory and every file in it."""
    out = []
    for i, layer in enumerate(layers):
        for word in layer:
            parts = word.split("+")
            for part in parts:
                out.append((i, part, word if len(parts) > 1 else None))
    return out


def matches(path, entry):
    if entry.endswith("/"):
        return path == entry.rstrip("/") or path.startswith(entry)
    return path == entry


def layer_of(mods, layers):
    """{module: (layer index, unit)}, and the errors of placing them."""
    out, errors = {}, []
    listed = entries(layers)
    for mod in mods:
        path = mod.replace("::", "/") or "lib"
        best = None
        for i, entry, unit in listed:
            if matches(path, entry) and (best is None or len(entry) > len(best[1])):
                best = (i, entry, unit)
        if best is None:
            errors.append(f"{path}: in no layer of docs/architecture.md's picture; add it")
        else:
            out[mod] = (best[0], best[2])
    for _, entry, _ in listed:
        if not any(matches(m.replace("::", "/") or "lib", entry) for m in mods):
            errors.append(f"{entry}: named in docs/architecture.md's layers but no such module")
    return out, errors


def main():
    mods = modules()
    REEXPORTS.update(reexports(mods))
    es = edges(mods)
    cycles = scc(mods, es)
    top = {(a.split("::")[0], b.split("::")[0]) for a, b in es if a.split("::")[0] != b.split("::")[0]}
    top_cycles = scc({m.split("::")[0] for m in mods}, top)
    if "--report" in sys.argv:
        print(f"{len(mods)} modules, {len(es)} file-level edges")
        print(f"file-level import circles (strongly connected sets): {len(cycles)}"
              f" covering {sum(map(len, cycles))} modules")
        for c in cycles:
            print("   ", " ".join(x or "lib" for x in c))
        print(f"top-level-module import circles: {len(top_cycles)}")
        for c in top_cycles:
            print("   ", " ".join(x or "lib" for x in c))
        if "--edges" in sys.argv:
            for a, b in sorted(es):
                print(f"  {a or 'lib'} -> {b or 'lib'}")
        return 0
    doc = sys.argv[sys.argv.index("--layers") + 1] if "--layers" in sys.argv else DOC
    layers = declared(doc)
    where, errors = layer_of(mods, layers)
    for a, b in sorted(es):
        if a in where and b in where and where[b][0] > where[a][0]:
            errors.append(f"{a.replace('::', '/') or 'lib'} (layer {where[a][0] + 1}) uses "
                          f"{b.replace('::', '/') or 'lib'} (layer {where[b][0] + 1}): against the declared order")
    for c in cycles:
        units = {where.get(x, (None, None))[1] for x in c}
        if len(units) == 1 and None not in units:
            continue  # one concept in two files, declared as such
        errors.append("import circle: " + " -> ".join(x.replace("::", "/") for x in c))
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"{len(errors)} layering error(s); the order is in docs/architecture.md#layers", file=sys.stderr)
        return 1
    print(f"layers: {len(mods)} modules, {len(es)} edges, {len(layers)} layers, in order, no circle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
