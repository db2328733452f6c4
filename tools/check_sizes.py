#!/usr/bin/env python3
"""Fails when a C++ file is longer than --max-file-lines (800) or a function outside tests is
longer than --max-function-lines (120).

Reads *.cc, *.h and *.cu under the given folders (default: every C++ folder of the repository),
leaving out generated files (*.pb.*), third_party/ and test data. A file counts as a test when its
name ends in _test.cc, _test_util.*, or it lies under tests/; its functions are not measured (its
length is). A function is a brace block whose enclosing blocks are all namespaces, classes,
structs or `extern "C"`, and whose header ends in `)` (with qualifiers such as `const`,
`override`, `noexcept`, a trailing return type or a constructor's initializer list after it).
Its length is counted from the line of its name to the line of its closing brace.

Every finding is printed as `path:line: ...`; the exit status is 1 when there is one, else 0.

Usage: tools/check_sizes.py [--max-file-lines N] [--max-function-lines N] [--root DIR] [FOLDER...]
"""

import argparse
import os
import re
import sys

DEFAULT_FOLDERS = ("agent", "base", "bench", "client", "contract", "coordinator", "core",
                   "examples", "proto", "rpc", "tests", "tools", "worker")
EXTENSIONS = (".cc", ".h", ".cu", ".inc")
SKIPPED_DIRS = {"testdata", "fixtures", ".git", "third_party", "corpus", "crashes"}
SCOPE_HEADER = re.compile(r"(^|[\s;}])(namespace\b[^;{]*|extern\s+\"C\"\s*|"
                          r"(class|struct|union)\b[^;{()]*)$")
NOT_A_FUNCTION = re.compile(r"(^|[^\w])(enum|if|for|while|switch|catch|do|else)\b")


def is_test(path):
    name = os.path.basename(path)
    return (name.endswith("_test.cc") or "_test_util." in name or "/tests/" in "/" + path or
            name.endswith("_fuzzer.cc"))


def strip_code(text):
    """The text with comments, string and character literals blanked (newlines kept)."""
    out = []
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and (text[i - 1].isalnum()):
                out.append(c)  # a digit separator (1'000)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def long_functions(path, limit):
    """(line, length, header) of each function of `path` longer than `limit` lines."""
    with open(path, encoding="utf-8", errors="replace") as f:
        code = strip_code(f.read())
    # Preprocessor lines never open or close a function.
    code = re.sub(r"(?m)^[ \t]*#.*$", "", code)
    stack = []  # one entry per open brace: ("scope" | "function" | "block", start line, header)
    header_start = 0
    line = 1
    found = []
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c == "{":
            header = code[header_start:i]
            flat = " ".join(header.split())
            if all(kind == "scope" for kind, _, _ in stack):
                if SCOPE_HEADER.search(flat) or flat.endswith("=") or flat == "":
                    kind = "scope" if SCOPE_HEADER.search(flat) else "block"
                elif ")" in flat and not NOT_A_FUNCTION.search(flat.split("(")[0]):
                    kind = "function"
                else:
                    kind = "block"
                first = line - header.rstrip().count("\n") + len(header) - len(header.lstrip())
                stripped = header.lstrip()
                first = line - header[len(header) - len(stripped):].count("\n")
                stack.append((kind, first, flat[-100:]))
            else:
                stack.append(("block", line, ""))
            header_start = i + 1
        elif c == "}":
            if stack:
                kind, first, flat = stack.pop()
                if kind == "function" and line - first + 1 > limit:
                    found.append((first, line - first + 1, flat))
            header_start = i + 1
        elif c == ";":
            header_start = i + 1
    return found


def source_files(root, folders):
    for folder in folders:
        top = os.path.join(root, folder)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
            for name in sorted(filenames):
                if name.endswith(EXTENSIONS) and ".pb." not in name:
                    yield os.path.relpath(os.path.join(dirpath, name), root)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-file-lines", type=int, default=800)
    parser.add_argument("--max-function-lines", type=int, default=120)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("folders", nargs="*", default=DEFAULT_FOLDERS)
    args = parser.parse_args()
    findings = 0
    for rel in source_files(args.root, args.folders):
        path = os.path.join(args.root, rel)
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = sum(1 for _ in f)
        if lines > args.max_file_lines:
            print(f"{rel}:1: {lines} lines, over {args.max_file_lines}: split it by concern")
            findings += 1
        if is_test(rel):
            continue
        for first, length, header in long_functions(path, args.max_function_lines):
            print(f"{rel}:{first}: function of {length} lines, over {args.max_function_lines}: "
                  f"{header}")
            findings += 1
    if findings:
        print(f"check_sizes: {findings} finding(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
