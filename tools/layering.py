"""The layering rules of libdiwarp, read from the folders' READMEs.

Shared by tools/check-layering.py (which checks the tree against them) and
tools/include-trees.py (which gives each folder's library an include path
reaching only what they allow), so that the build and the check read the
same lines the same way.

Every folder of libdiwarp/ says in its README.md which folders it may use,
on one line that starts with "May call:" (backticked names: `qp/`,
`llp/tcp.h`, `dw.h`; anything else on the line, such as libc, is not a
folder of the engine). The line ends at its paragraph, or earlier where it
goes on to say what the folder may not use or who calls it ("Never ...",
"Nothing ...", "Called by: ..."): the names there are not allowed.
An allowed folder followed by "only through" and backticked function names
("`rd/` only through `dw_rd_rc_attach`") narrows the arrow to those calls.
tools/layering-exceptions.txt lists the arrows the tree still has against
those lines ("FROM -> TO  why").
"""
import os
import re

ROOT_HEADER = "dw.h"  # libdiwarp/dw.h: the engine's core (device, QP) structures
ROOT_OWNER = "qp"  # the folder dw.h belongs to: its includes are qp/'s


def folders(lib):
    """The folders of the engine (libdiwarp/*/), sorted."""
    return sorted(d for d in os.listdir(lib) if os.path.isdir(os.path.join(lib, d)))


def readme_allows(lib, names):
    """(folder -> set of folders (and "dw.h") its README lets it use, itself
    included; folders whose README has no "May call:" line)."""
    allowed, missing = {}, []
    for f in names:
        path = os.path.join(lib, f, "README.md")
        text = open(path).read() if os.path.exists(path) else ""
        m = re.search(r"^(?:- )?May call:?(.*?)(?:\n\s*\n|\n- |\Z)", text, re.M | re.S)
        if not m:
            missing.append(f)
            continue
        # The line may go on with what the folder may not use or who calls
        # it ("Never a transport (`qp/`)", "Called by: `qp/`"): not allowed.
        line = re.split(r"\b(?:Called by|Never|Nothing)\b", m.group(1))[0]
        allowed_names = set()
        for tok in re.findall(r"`([^`]+)`", line):
            tok = tok.strip()
            if tok == ROOT_HEADER:
                allowed_names.add(ROOT_HEADER)
                continue
            head = tok.split("/")[0]
            if "/" in tok and head in names:
                allowed_names.add(head)
        allowed[f] = allowed_names | {f}
    if ROOT_OWNER in allowed:
        allowed[ROOT_OWNER].add(ROOT_HEADER)  # the core header is qp/'s own (device, QP)
    return allowed, missing


NARROW = re.compile(r"`(\w+)/[^`]*`\s+only through\s+((?:`\w+`(?:\s*,\s*|\s+and\s+)?)+)")


def readme_narrow(lib, names):
    """{(folder, to): the only symbols of to it may call} for the arrows a
    README narrows to named calls ("`rd/` only through `dw_rd_rc_attach`"
    on its "May call:" line)."""
    narrow = {}
    for f in names:
        path = os.path.join(lib, f, "README.md")
        text = open(path).read() if os.path.exists(path) else ""
        m = re.search(r"^(?:- )?May call:?(.*?)(?:\n\s*\n|\n- |\Z)", text, re.M | re.S)
        for n in NARROW.finditer(m.group(1) if m else ""):
            narrow[(f, n.group(1))] = set(re.findall(r"`(\w+)`", n.group(2)))
    return narrow


def exceptions(path):
    """([(from, to)] in file order, [error lines]) of layering-exceptions.txt."""
    arrows, errors = [], []
    for n, line in enumerate(open(path), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"(\S+)\s*->\s*(\S+)\s+(\S.*)$", line)
        if not m:
            errors.append(f"{path}:{n}: expected 'FROM -> TO  why'")
            continue
        arrows.append((m.group(1), m.group(2)))
    return arrows, errors
