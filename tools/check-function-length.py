#!/usr/bin/env python3
"""Checks that no C function of the tree is longer than it should be.

    tools/check-function-length.py SOURCE_ROOT [--max N] [--list]
    tools/check-function-length.py --self-test

The project keeps functions mostly under 60 lines and none over 100
(--max) unless the function says why it must be one piece: the comment
block right above it (or the line right above it) holds the marker
"one piece:" followed by the reason. This script reads every .c and .h
file under libdiwarp/, verbs-provider/, daemon/ and tools/ of SOURCE_ROOT
and prints one line per function over the limit that lacks the marker.

A function runs from the first line of its signature (multi-line
signatures count, and so do the return type and storage class on lines of
their own) to its closing brace. Comments, strings and preprocessor lines
are blanked before the braces are counted.

Exit 0 when every long function carries the marker, 1 with one line per
long function without it, 2 when the input is missing or a file's braces
do not balance. --list prints every function over the limit, marked or
not, with its length. --self-test runs the checker on a small generated
tree (a long function without the marker, one with it, a short one) and
exits 1 unless it tells them apart.
"""
import io
import os
import re
import sys
import tempfile

FOLDERS = ("libdiwarp", "verbs-provider", "daemon", "tools")
DEFAULT_MAX = 100
MARKER = re.compile(r"one piece:\s*\S")
CALLED = re.compile(r"([A-Za-z_]\w*)\s*\(")
NOT_NAMES = {"__attribute__", "__declspec", "if", "while", "for", "switch", "sizeof"}


def blank_noncode(text):
    """text with comments, string and character literals and preprocessor
    lines replaced by spaces (newlines kept, so line numbers hold)."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            # a directive, with its continuation lines
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                if text.startswith("/*", i):
                    end = text.find("*/", i + 2)
                    end = n if end < 0 else end + 2
                    out.append(re.sub(r"[^\n]", " ", text[i:end]))
                    i = end
                    continue
                out.append(" ")
                i += 1
            continue
        if c == "\n":
            out.append(c)
            line_start = True
            i += 1
            continue
        if c in " \t":
            out.append(c)
            i += 1
            continue
        line_start = False
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(" " * (end - i))
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def function_name(head):
    """The name a declaration head ("static int f(int a)") declares, or None
    when the head is not a function's (an initializer, a struct...)."""
    depth = 0
    for ch in head:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "=" and depth == 0:
            return None
    if not head.rstrip().endswith(")"):
        return None
    for m in CALLED.finditer(head):
        if m.group(1) not in NOT_NAMES:
            return m.group(1)
    return None


def functions(path):
    """(name, first line, last line) of every function defined in path."""
    text = open(path, encoding="utf-8", errors="replace").read()
    code = blank_noncode(text)
    found = []
    depth = 0
    head_start = 0  # offset where the current top-level declaration begins
    fn = None  # (name, offset of its first character) while inside one
    for i, ch in enumerate(code):
        if ch == "{":
            if depth == 0:
                head = code[head_start:i]
                name = function_name(head)
                if name:
                    first = head_start + (len(head) - len(head.lstrip()))
                    fn = (name, first)
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                raise ValueError("%s:%d: '}' without its '{'" % (path, code.count("\n", 0, i) + 1))
            if depth == 0:
                if fn:
                    first = code.count("\n", 0, fn[1]) + 1
                    last = code.count("\n", 0, i) + 1
                    found.append((fn[0], first, last))
                    fn = None
                head_start = i + 1
        elif ch == ";" and depth == 0:
            head_start = i + 1
    if depth != 0:
        raise ValueError("%s: %d '{' never closed" % (path, depth))
    return found, text.split("\n")


def leading_comment(lines, first):
    """The line right above line `first` (1-based) and, when it ends a
    comment, the whole comment block it ends."""
    i = first - 2
    if i < 0:
        return ""
    block = [lines[i]]
    if lines[i].rstrip().endswith("*/"):
        while "/*" not in block[-1] and i > 0:
            i -= 1
            block.append(lines[i])
    elif lines[i].lstrip().startswith("//"):
        while i > 0 and lines[i - 1].lstrip().startswith("//"):
            i -= 1
            block.append(lines[i])
    return "\n".join(reversed(block))


def sources(root):
    for folder in FOLDERS:
        top = os.path.join(root, folder)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for f in sorted(filenames):
                if f.endswith((".c", ".h")):
                    yield os.path.join(dirpath, f)


def check(root, limit, listing, out=sys.stdout):
    if not all(os.path.isdir(os.path.join(root, f)) for f in FOLDERS):
        print("check-function-length: %s has no %s" % (root, ", ".join(FOLDERS)), file=sys.stderr)
        return 2
    bad = 0
    for path in sources(root):
        rel = os.path.relpath(path, root)
        try:
            found, lines = functions(path)
        except ValueError as e:
            print("check-function-length: cannot read the braces of %s" % e, file=sys.stderr)
            return 2
        for name, first, last in found:
            length = last - first + 1
            if length <= limit:
                continue
            marked = bool(MARKER.search(leading_comment(lines, first)))
            if listing:
                print("%s:%d: %s: %d lines%s" % (rel, first, name, length, " (one piece)" if marked else ""), file=out)
            elif not marked:
                print("%s:%d: %s is %d lines, over %d: split it into named steps, or say why it "
                      "must be one piece in a comment above it (\"one piece: REASON\")" %
                      (rel, first, name, length, limit), file=out)
            if not marked:
                bad += 1
    if listing:
        return 0
    return 1 if bad else 0


def self_test():
    """Runs the check on a generated tree; 0 when it gets every case right."""
    body = "".join("        x += %d;\n" % k for k in range(DEFAULT_MAX))
    long_fn = "static int\n%s(int x,\n    int y)\n{\n" + body + "        return x + y;\n}\n"
    cases = {
        "long.c": ("/* A function. */\n" + long_fn % "too_long", 1),
        "marked.c": ("/* one piece: a table read top to bottom. */\n" + long_fn % "kept", 0),
        "short.c": ("int short_one(void)\n{\n        return 0;\n}\n"
                    "static const int table[] = {\n" + "1,\n" * 200 + "};\n", 0),
        "tricky.c": ("/* } { */\nconst char *s = \"{\";\n#define OPEN {\n" + long_fn % "tricky", 1),
    }
    failed = 0
    with tempfile.TemporaryDirectory() as root:
        for f in FOLDERS:
            os.mkdir(os.path.join(root, f))
        for name, (text, want) in cases.items():
            for f in FOLDERS:
                for old in os.listdir(os.path.join(root, f)):
                    os.unlink(os.path.join(root, f, old))
            with open(os.path.join(root, "daemon", name), "w") as fp:
                fp.write(text)

            sink = io.StringIO()
            got = check(root, DEFAULT_MAX, False, sink)
            if got != want:
                print("self-test: %s: exit %d, want %d (%s)" % (name, got, want, sink.getvalue().strip()))
                failed += 1
            elif want and "%d lines" % (DEFAULT_MAX + 6) not in sink.getvalue():
                print("self-test: %s: wrong length reported: %s" % (name, sink.getvalue().strip()))
                failed += 1
    print("self-test: %s" % ("failed" if failed else "ok"))
    return 1 if failed else 0


def main():
    args = sys.argv[1:]
    if args == ["--self-test"]:
        return self_test()
    limit, listing, root = DEFAULT_MAX, False, None
    while args:
        a = args.pop(0)
        if a == "--max" and args:
            limit = int(args.pop(0))
        elif a == "--list":
            listing = True
        elif root is None and not a.startswith("--"):
            root = a
        else:
            root = None
            break
    if root is None:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    return check(root, limit, listing)


if __name__ == "__main__":
    sys.exit(main())
