#!/usr/bin/env python3
"""Checks libdiwarp's layering against the folders' own READMEs.

    tools/check-layering.py SOURCE_ROOT BUILD_DIR [STAMP]

Every folder of libdiwarp/ says in its README.md which folders it may use,
on one line that starts with "May call:" (read by tools/layering.py, as the
build's include trees are: tools/include-trees.py). This script checks both
ways a folder can reach another one:

  includes  every #include "X/..." (and "dw.h", the engine's core header at
            the root of libdiwarp/) in the folder's .c and .h files, and
            dw.h's own as qp/'s (the header is qp/'s);
  calls     every global symbol a folder's objects use and another folder's
            objects define (nm on the objects of each folder's library,
            BUILD_DIR/libdiwarp/libdiwarp-FOLDER.a.p); where the README
            narrows an arrow to named calls ("`rd/` only through
            `dw_rd_rc_attach`"), any other symbol of that folder is an error.

The daemon (daemon/) and the verbs provider (verbs-provider/) are programs
on the engine: they may include the public headers (include/diwarp/) only.

An arrow the README does not allow is an error unless
tools/layering-exceptions.txt lists it ("FROM -> TO  why"): the arrows the
tree still has and means to lose. A listed arrow the tree no longer has is
an error too, so the list only shrinks. Exit 0 when everything holds, 1
with one line per broken rule, 2 when the inputs are missing. With STAMP
(the build runs it so: libdiwarp/meson.build) the file STAMP is written
when everything holds, and a broken rule fails the build.
"""
import os
import re
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layering import ROOT_HEADER, ROOT_OWNER, exceptions as read_exceptions, folders as \
    engine_folders, readme_allows, readme_narrow  # noqa: E402


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
OUTER = ("daemon", "verbs-provider")  # programs on the engine: public headers only


def includes(d, only=None):
    """(file name, included name, engine folder or dw.h it names) for every
    quoted #include of the .c and .h files of directory d (or of its file
    named only)."""
    for name in [only] if only else sorted(os.listdir(d)):
        if name.endswith((".c", ".h")):
            for m in INCLUDE.finditer(open(os.path.join(d, name)).read()):
                target = m.group(1)
                yield name, target, ROOT_HEADER if target == ROOT_HEADER else target.split("/")[0]


def include_arrows(src, lib, folders):
    """{(from, to): first "file includes header"} for includes that leave a
    folder of the engine, and for engine headers the daemon or the provider
    include (they may use include/diwarp/ only)."""
    arrows = {}
    for f in folders:
        sources = [(os.path.join(lib, f), None, f"{f}/")]
        if f == ROOT_OWNER:
            sources.append((lib, ROOT_HEADER, ""))
        for d, only, shown in sources:
            for name, target, to in includes(d, only):
                if to != f and (to == ROOT_HEADER or to in folders):
                    arrows.setdefault((f, to), f"{shown}{name} includes {target}")
    for o in OUTER:
        if os.path.isdir(os.path.join(src, o)):
            for name, target, to in includes(os.path.join(src, o)):
                if to == ROOT_HEADER or (to in folders and "/" in target):
                    arrows.setdefault((o, to), f"{o}/{name} includes {target}")
    return arrows


def call_arrows(objdirs):
    """{(from, to): [symbols]} for symbols a folder's objects take from another's
    (objdirs: folder -> the directory of its library's objects), sorted."""
    nm = shutil.which("gcc-nm") or shutil.which("nm")
    defined, used = {}, {}
    objs = sorted((f, o) for f, d in objdirs.items() for o in os.listdir(d) if o.endswith(".o"))
    for folder, obj in objs:
        out = subprocess.run([nm, "-P", os.path.join(objdirs[folder], obj)], capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue
            sym, kind = parts[0], parts[1]
            if kind == "U":
                used.setdefault(folder, set()).add(sym)
            elif kind in "TDBRVWGS":
                defined.setdefault(sym, folder)
    arrows = {}
    for f, syms in used.items():
        for s in sorted(syms):
            to = defined.get(s)
            if to and to != f:
                arrows.setdefault((f, to), []).append(s)
    return arrows


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    src, build = sys.argv[1], sys.argv[2]
    stamp = sys.argv[3] if len(sys.argv) == 4 else None
    lib = os.path.join(src, "libdiwarp")
    if not os.path.isdir(lib):
        print(f"check-layering: need {lib}", file=sys.stderr)
        return 2
    folders = engine_folders(lib)
    objdirs = {f: os.path.join(build, "libdiwarp", f"libdiwarp-{f}.a.p") for f in folders}
    absent = [d for d in objdirs.values() if not os.path.isdir(d)]
    if absent:
        print(f"check-layering: need {', '.join(absent)} (each folder is a library of "
              "libdiwarp/meson.build's layers)", file=sys.stderr)
        return 2
    allowed, missing = readme_allows(lib, folders)
    errors = [f"libdiwarp/{f}/README.md: no 'May call:' line" for f in missing]

    listed, exc_errors = read_exceptions(os.path.join(src, "tools", "layering-exceptions.txt"))
    errors += exc_errors
    exceptions = {arrow: False for arrow in listed}

    calls = call_arrows(objdirs)
    for (f, to), only in sorted(readme_narrow(lib, folders).items()):
        beyond = [s for s in calls.get((f, to), []) if s not in only]
        if beyond:
            errors.append(f"{f}/ -> {to}/ (calls: {', '.join(beyond)}): libdiwarp/{f}/README.md "
                          f"allows only {', '.join(sorted(only))}")
    for kind, arrows in (("includes", include_arrows(src, lib, folders)),
                         ("calls", {a: syms[0] for a, syms in calls.items()})):
        for (f, to), where in sorted(arrows.items()):
            if f not in OUTER and (f not in allowed or to in allowed[f]):
                continue
            if (f, to) in exceptions:
                exceptions[(f, to)] = True
                continue
            rule = ("only include/diwarp/ is public" if f in OUTER else
                    f"not in libdiwarp/{f}/README.md's 'May call:' line")
            errors.append(f"{f}/ -> {to}{'' if to == ROOT_HEADER else '/'} ({kind}: {where}): "
                          f"{rule}")
    for (f, to), seen in sorted(exceptions.items()):
        if not seen:
            errors.append(f"tools/layering-exceptions.txt: '{f} -> {to}' no longer exists: "
                          "remove the line")
    for e in errors:
        print(e)
    if not errors:
        n = sum(len(a) - 1 for a in allowed.values())
        print(f"layering: {len(folders)} folders, {n} allowed arrows, "
              f"{len(exceptions)} listed exceptions: ok")
        if stamp:
            with open(stamp, "w") as f:
                f.write("ok\n")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
