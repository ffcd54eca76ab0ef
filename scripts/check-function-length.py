#!/usr/bin/env python3
"""Fails when a function body in zoe's sources is longer than the limit (default 120 lines).

A long function hides its rules: each rule should sit in a named function a reader can find from
the docs. Checked: the C++ sources in src/, tools/, offload/, io/ and python/_zoe.cpp, and the
Python sources in python/zoe/.

C++: a function is a brace block opened outside any other function whose header has a parameter
list; its length is the lines from its header's first line to its closing brace. Comments and
string literals are ignored. Lambdas count toward the function that holds them.

Python: a function is a def or async def (a module's function or a method, in a class at any
depth) that no other def holds; its length is exact, from Python's ast: the lines from its def
line (lineno; decorators not counted) to its last line (end_lineno), docstring, comments and
blank lines inside it included. A def inside a function (a closure, or a class defined there)
counts toward the function that holds it, as a lambda does in C++.
Usage: scripts/check-function-length.py [--limit N] [--list] [repo root]
  --list   print every function over the limit (and the longest ones) without failing
"""
import ast
import os
import re
import sys

FOLDERS = ["src", "tools", "offload", "io"]
FILES = ["python/_zoe.cpp"]
PY_FOLDERS = ["python/zoe"]
SOURCES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
SCOPE = re.compile(r"\b(namespace|class|struct|union|enum)\b[^()]*$")
CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|do|else|try)\b")


def strip(text):
    """Blanks comments, string and char literals, keeping newlines (so line numbers hold)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == '_')):
            m = re.match(r'R"([^(]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = ")" + m.group(1) + '"'
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j - 1]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * max(0, min(j, n) - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """Yields (name, first line, last line) of each function body in the file."""
    text = strip(open(path, encoding="utf-8", errors="replace").read())
    stack = []  # entries: ("scope"|"func"|"block", start line, name)
    header_start = 0  # offset where the current declaration's text begins
    line = 1
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c in ";":
            if not any(k == "func" for k, _, _ in stack):
                header_start = i + 1
        elif c == "{":
            in_func = any(k == "func" for k, _, _ in stack)
            if in_func:
                stack.append(("block", line, ""))
                continue
            header = text[header_start:i]
            flat = " ".join(header.split())
            if SCOPE.search(flat) or flat.endswith("extern \"\"") or "=" in flat.split("(")[0] and "operator" not in flat:
                stack.append(("scope" if SCOPE.search(flat) else "block", line, ""))
            elif ")" in flat and not CONTROL.match(flat):
                first = line - header.rstrip().count("\n") + (len(header) - len(header.lstrip())) * 0
                # the header's first non-blank line
                lead = header[: len(header) - len(header.lstrip())]
                first = line - header.count("\n") + lead.count("\n")
                name = re.findall(r"([~\w:]+(?:operator\S*)?)\s*\(", flat)
                stack.append(("func", first, name[0] if name else flat[:40]))
            else:
                stack.append(("block", line, ""))
            header_start = i + 1
        elif c == "}":
            if stack:
                kind, start, name = stack.pop()
                if kind == "func":
                    yield name, start, line
            if not any(k == "func" for k, _, _ in stack):
                header_start = i + 1


def python_functions(path):
    """Yields (qualified name, def line, last line) of each Python function no other def holds."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + child.name, child.lineno, child.end_lineno
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, prefix + child.name + ".")
            else:  # if/try/with at module or class level: the defs inside them
                yield from visit(child, prefix)

    yield from visit(tree, "")


def sources(root):
    """Each checked file with the function that measures it."""
    paths = [os.path.join(root, f) for f in FILES if os.path.exists(os.path.join(root, f))]
    for top in FOLDERS:
        for dirpath, dirnames, files in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("build"))
            paths += [os.path.join(dirpath, f) for f in sorted(files) if f.endswith(SOURCES)]
    out = [(p, functions) for p in paths]
    for top in PY_FOLDERS:
        folder = os.path.join(root, top)
        if os.path.isdir(folder):
            out += [(os.path.join(folder, f), python_functions) for f in sorted(os.listdir(folder))
                    if f.endswith(".py")]
    return out


def main():
    args = sys.argv[1:]
    limit = 120
    listing = False
    if "--list" in args:
        listing = True
        args.remove("--list")
    if "--limit" in args:
        k = args.index("--limit")
        limit = int(args[k + 1])
        del args[k:k + 2]
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), ".."))
    long = []
    count = 0
    for p, measure in sources(root):
        try:
            found = list(measure(p))
        except SyntaxError as e:
            print(f"check-function-length: {os.path.relpath(p, root)}:{e.lineno}: cannot be parsed ({e.msg}), so "
                  "its functions cannot be measured; fix the syntax", file=sys.stderr)
            return 1
        for name, a, b in found:
            count += 1
            n = b - a + 1
            if n > limit:
                long.append((n, os.path.relpath(p, root), a, name))
    long.sort(reverse=True)
    for n, rel, a, name in long:
        print(f"{rel}:{a}: {name} is {n} lines (limit {limit})")
    if listing:
        return 0
    if long:
        print(f"check-function-length: {len(long)} of {count} functions are over {limit} lines; split each rule "
              "into a named function", file=sys.stderr)
        return 1
    print(f"check-function-length: {count} functions, none over {limit} lines", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
