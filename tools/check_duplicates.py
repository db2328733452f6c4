#!/usr/bin/env python3
"""Fails when a block of 15 or more meaningful lines stands twice in the C++ sources.

Reads *.cc, *.h and *.cu under every C++ folder of the repository (or the folders given),
leaving out generated files (*.pb.*) and test data (testdata/, fixtures/). Each file is
normalised to its meaningful lines: whitespace stripped; blank lines, comment-only lines, lines
of lone braces or punctuation and #include lines dropped. Every run of at least --min-lines
consecutive meaningful lines that occurs twice (in one file or in two) is printed as

    path:first-last ~ path:first-last   (N lines)

with the original line numbers, and the exit status is 1. Exit status 0: no such run.

Usage: tools/check_duplicates.py [--min-lines N] [--root DIR] [FOLDER...]
"""

import argparse
import collections
import os
import re
import sys

DEFAULT_FOLDERS = ("agent", "base", "bench", "client", "contract", "coordinator", "core",
                   "examples", "proto", "rpc", "tests", "tools", "worker")
EXTENSIONS = (".cc", ".h", ".cu")
SKIPPED_DIRS = {"testdata", "fixtures", ".git"}
PUNCTUATION_ONLY = re.compile(r"^[{}()\[\];,:]*$")


def is_generated(name):
    return ".pb." in name or name.endswith("_generated.h")


def meaningful_lines(path):
    """The (line number, normalised text) of each meaningful line of `path`."""
    result = []
    in_block_comment = False
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, raw in enumerate(f, start=1):
            line = raw.strip()
            if in_block_comment:
                end = line.find("*/")
                if end < 0:
                    continue
                in_block_comment = False
                line = line[end + 2:].strip()
            if line.startswith("/*"):
                end = line.find("*/", 2)
                if end < 0:
                    in_block_comment = True
                    continue
                line = line[end + 2:].strip()
            if not line or line.startswith("//"):
                continue
            if line.startswith("#include") or PUNCTUATION_ONLY.match(line):
                continue
            result.append((number, line))
    return result


def source_files(root, folders):
    for folder in folders:
        top = os.path.join(root, folder)
        for directory, subdirs, names in os.walk(top):
            subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS)
            for name in sorted(names):
                if name.endswith(EXTENSIONS) and not is_generated(name):
                    yield os.path.relpath(os.path.join(directory, name), root)


def find_runs(files, min_lines):
    """Maximal runs of >= min_lines equal meaningful lines, as (file_a, i, file_b, j, length)
    over indices into the meaningful lines; each pair of places once."""
    windows = collections.defaultdict(list)
    texts = {}
    for path, lines in files.items():
        texts[path] = [text for _, text in lines]
        for i in range(len(lines) - min_lines + 1):
            windows[hash(tuple(texts[path][i:i + min_lines]))].append((path, i))
    matches = set()
    for places in windows.values():
        if len(places) < 2:
            continue
        for x in range(len(places)):
            for y in range(x + 1, len(places)):
                (a, i), (b, j) = places[x], places[y]
                if texts[a][i:i + min_lines] == texts[b][j:j + min_lines]:
                    matches.add((a, i, b, j))
    runs = []
    for a, i, b, j in sorted(matches):
        if (a, i - 1, b, j - 1) in matches:
            continue  # inside a run that starts earlier
        k = 0
        while (a, i + k + 1, b, j + k + 1) in matches:
            k += 1
        runs.append((a, i, b, j, k + min_lines))
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="*", default=list(DEFAULT_FOLDERS))
    parser.add_argument("--min-lines", type=int, default=15)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    args = parser.parse_args()

    files = {path: meaningful_lines(os.path.join(args.root, path))
             for path in source_files(args.root, args.folders)}
    runs = find_runs(files, args.min_lines)
    for a, i, b, j, length in runs:
        la, lb = files[a], files[b]
        print(f"{a}:{la[i][0]}-{la[i + length - 1][0]} ~ "
              f"{b}:{lb[j][0]}-{lb[j + length - 1][0]}   ({length} lines)")
    if runs:
        print(f"{len(runs)} repeated block(s) of {args.min_lines} or more meaningful lines in "
              f"{', '.join(args.folders)}: extract the shared code", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
