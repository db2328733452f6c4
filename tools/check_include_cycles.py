#!/usr/bin/env python3
"""Fails when the packages of the workspace include each other in a cycle.

Reads every #include "..." of the C++ sources (*.cc, *.h, *.cu, *.inc) and maps both the
including file and the included header to their Bazel package (the nearest folder above with a
BUILD.bazel). Headers under an `include/` folder (the SDK's public headers, included as
"substrax/x.h") are found by their name. An edge P -> Q means a file of P includes a header of Q.
Every strongly connected component of more than one package is a cycle: it is printed with one
include of each edge in it, and the exit status is 1. Bazel already refuses cycles between
targets; this finds the package-level ones that target-level visibility does not see (two
packages whose targets include each other's headers through targets that do not cycle).

Usage: tools/check_include_cycles.py [--root DIR]
"""

import argparse
import os
import re
import sys

EXTENSIONS = (".cc", ".h", ".cu", ".inc")
SKIPPED_DIRS = {".git", "third_party", "testdata", "fixtures", "corpus", "crashes"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def package_of(root, rel):
    """The nearest folder at or above rel's folder with a BUILD.bazel, relative to root."""
    folder = os.path.dirname(rel)
    while True:
        if os.path.exists(os.path.join(root, folder, "BUILD.bazel")):
            return folder
        if not folder:
            return ""
        folder = os.path.dirname(folder)


def sources(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in SKIPPED_DIRS and not d.startswith("bazel-"))
        for name in sorted(filenames):
            if name.endswith(EXTENSIONS):
                yield os.path.relpath(os.path.join(dirpath, name), root)


def strongly_connected(graph):
    """Tarjan's algorithm: the strongly connected components of `graph` (node -> set)."""
    index, low, on_stack, stack, result = {}, {}, set(), [], []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            result.append(sorted(component))

    sys.setrecursionlimit(10000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    files = list(sources(root))
    # Public headers are included by their path below include/ ("substrax/program.h").
    public = {}
    for rel in files:
        parts = rel.split(os.sep)
        if "include" in parts:
            public[os.sep.join(parts[parts.index("include") + 1:])] = rel
    graph, example = {}, {}
    for rel in files:
        source_package = package_of(root, rel)
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for header in INCLUDE.findall(text):
            target = header if os.path.exists(os.path.join(root, header)) else public.get(header)
            if target is None:
                continue  # a generated header (*.pb.h) or a system one
            header_package = package_of(root, target)
            if header_package == source_package:
                continue
            graph.setdefault(source_package, set()).add(header_package)
            example.setdefault((source_package, header_package), "%s includes %s" % (rel, header))
    cycles = [c for c in strongly_connected(graph) if len(c) > 1]
    for component in cycles:
        members = set(component)
        print("include cycle between packages: " + ", ".join(p or "//" for p in component))
        for (a, b), why in sorted(example.items()):
            if a in members and b in members:
                print("  %s -> %s: %s" % (a or "//", b or "//", why))
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
