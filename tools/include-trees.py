#!/usr/bin/env python3
"""Makes the include trees that hold libdiwarp's folders to their layering.

    tools/include-trees.py SOURCE_ROOT OUTDIR LISTING

Each folder of libdiwarp/ is compiled as its own library with one include
directory of the engine, OUTDIR/FOLDER (libdiwarp/meson.build), instead of
libdiwarp/ itself. That directory holds symbolic links to the folder's own
headers and, named as the folders are, to the trees of the folders the
folder's README allows on its "May call:" line (read by tools/layering.py,
as tools/check-layering.py reads it), itself and the arrows still listed in
tools/layering-exceptions.txt: so #include "X/h.h" of a folder one may not
call finds no file and the compiler stops there.

A header is read through the tree of its own folder (OUTDIR/F/Y/h.h is
OUTDIR/Y/h.h), so the includes it makes itself are looked for first among
the folders its own folder may use (then, as the compiler goes on to the
include path, among the includer's: a header is held to its own folder's
arrows alone where its own folder's sources include it, and in every case
by tools/check-layering.py). dw.h belongs to qp/: OUTDIR/qp/dw.h links
to it, and another folder allowed dw.h gets a one-line dw.h that includes
OUTDIR/qp/dw.h (by absolute path), so that dw.h's own includes are qp/'s.

OUTDIR is made afresh on each run; LISTING gets one line per folder with
what its tree reaches (meson runs this at configure time, and again when a
README or the exceptions change).
"""
import os
import shutil
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layering import ROOT_HEADER, ROOT_OWNER, exceptions, folders, readme_allows  # noqa: E402


def main():
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    src, out, listing = os.path.abspath(sys.argv[1]), sys.argv[2], sys.argv[3]
    lib = os.path.join(src, "libdiwarp")
    names = folders(lib)
    allowed, _ = readme_allows(lib, names)  # a missing line: check-layering.py says so
    listed, _ = exceptions(os.path.join(src, "tools", "layering-exceptions.txt"))
    shutil.rmtree(out, ignore_errors=True)
    lines = []
    for f in names:
        reach = set(allowed.get(f, {f})) | {to for frm, to in listed if frm == f}
        reach = {r for r in reach if r in names or r == ROOT_HEADER}
        tree = os.path.join(out, f)
        os.makedirs(tree)
        for h in sorted(os.listdir(os.path.join(lib, f))):
            if h.endswith(".h"):
                os.symlink(os.path.join(lib, f, h), os.path.join(tree, h))
        for r in sorted(reach - {ROOT_HEADER}):
            os.symlink(os.path.join("..", r), os.path.join(tree, r))
        if f == ROOT_OWNER:
            os.symlink(os.path.join(lib, ROOT_HEADER), os.path.join(tree, ROOT_HEADER))
        elif ROOT_HEADER in reach:
            with open(os.path.join(tree, ROOT_HEADER), "w") as h:
                # By absolute path: a header reached through a folder's
                # link to itself (OUTDIR/F/F/h.h) would make "../" name
                # OUTDIR/F/ROOT_OWNER/, which exists only physically, and
                # ninja, which reads the dependency paths as written, would
                # take the missing file for a change and rebuild every time.
                owner = os.path.join(os.path.abspath(out), ROOT_OWNER, ROOT_HEADER)
                h.write(f'/* {ROOT_HEADER} is {ROOT_OWNER}/\'s: its includes are {ROOT_OWNER}/\'s '
                        f'(tools/include-trees.py) */\n#include "{owner}"\n')
        lines.append(f"{f}: " + " ".join(sorted(reach)))
    with open(listing, "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
