#!/usr/bin/env python3
"""Checks libdiwarp's layering against the folders' own READMEs.

    tools/check-layering.py SOURCE_ROOT BUILD_DIR [STAMP]

Every folder of libdiwarp/ says in its README.md which folders it may use,
on one line that starts with "May call:" (backticked names: `qp/`,
`llp/tcp.h`, `dw.h`; anything else on the line, such as libc, is not a
folder of the engine). This script checks both ways a folder can reach
another one:

  includes  every #include "X/..." (and "dw.h", the engine's core header at
            the root of libdiwarp/) in the folder's .c and .h files;
  calls     every global symbol a folder's objects use and another folder's
            objects define (nm on BUILD_DIR/libdiwarp/libdiwarp.a.p).

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

ROOT_HEADER = "dw.h"  # libdiwarp/dw.h: the engine's core (device, QP) structures


def readme_allows(lib, folders):
    """folder -> set of folders (and "dw.h") its README lets it use."""
    allowed, missing = {}, []
    for f in folders:
        path = os.path.join(lib, f, "README.md")
        text = open(path).read() if os.path.exists(path) else ""
        m = re.search(r"^(?:- )?May call:?(.*?)(?:\n\s*\n|\n- |\Z)", text, re.M | re.S)
        if not m:
            missing.append(f)
            continue
        names = set()
        for tok in re.findall(r"`([^`]+)`", m.group(1)):
            tok = tok.strip()
            if tok == ROOT_HEADER:
                names.add(ROOT_HEADER)
                continue
            head = tok.split("/")[0]
            if "/" in tok and head in folders:
                names.add(head)
        allowed[f] = names | {f}
    if "qp" in allowed:
        allowed["qp"].add(ROOT_HEADER)  # the core header is qp/'s own (device, QP)
    return allowed, missing


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
OUTER = ("daemon", "verbs-provider")  # programs on the engine: public headers only


def includes(d):
    """(file name, included name, engine folder or dw.h it names) for every
    quoted #include of the .c and .h files of directory d."""
    for name in sorted(os.listdir(d)):
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
        for name, target, to in includes(os.path.join(lib, f)):
            if to != f and (to == ROOT_HEADER or to in folders):
                arrows.setdefault((f, to), f"{f}/{name} includes {target}")
    for o in OUTER:
        if os.path.isdir(os.path.join(src, o)):
            for name, target, to in includes(os.path.join(src, o)):
                if to == ROOT_HEADER or (to in folders and "/" in target):
                    arrows.setdefault((o, to), f"{o}/{name} includes {target}")
    return arrows


def call_arrows(objdir, folders):
    """{(from, to): "symbol"} for symbols a folder's objects take from another's."""
    nm = shutil.which("gcc-nm") or shutil.which("nm")
    defined, used = {}, {}
    for obj in sorted(os.listdir(objdir)):
        if not obj.endswith(".o"):
            continue
        folder = obj.split("_", 1)[0]
        if folder not in folders:
            continue  # version.c and the like, at the root
        out = subprocess.run([nm, "-P", os.path.join(objdir, obj)], capture_output=True,
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
                arrows.setdefault((f, to), s)
    return arrows


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    src, build = sys.argv[1], sys.argv[2]
    stamp = sys.argv[3] if len(sys.argv) == 4 else None
    lib = os.path.join(src, "libdiwarp")
    objdir = os.path.join(build, "libdiwarp", "libdiwarp.a.p")
    if not os.path.isdir(lib) or not os.path.isdir(objdir):
        print(f"check-layering: need {lib} and {objdir}", file=sys.stderr)
        return 2
    folders = sorted(d for d in os.listdir(lib) if os.path.isdir(os.path.join(lib, d)))
    allowed, missing = readme_allows(lib, folders)
    errors = [f"libdiwarp/{f}/README.md: no 'May call:' line" for f in missing]

    exceptions = {}
    exc_path = os.path.join(src, "tools", "layering-exceptions.txt")
    for n, line in enumerate(open(exc_path), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"(\S+)\s*->\s*(\S+)\s+(\S.*)$", line)
        if not m:
            errors.append(f"{exc_path}:{n}: expected 'FROM -> TO  why'")
            continue
        exceptions[(m.group(1), m.group(2))] = False

    for kind, arrows in (("includes", include_arrows(src, lib, folders)),
                         ("calls", call_arrows(objdir, folders))):
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
