# The grader's import guard, run in EVAL's sandbox in two steps (see guard.rs):
#
#   probe DIR        before the agent's changes are applied: records the workspace's
#                    own module entries (DIR/baseline) and the top-level names that
#                    resolve outside the workspace: the standard library and every
#                    installed distribution (DIR/reserved). Runs with -P, in the
#                    workspace as the task's setup left it.
#   sweep DIR FILES  after the changes are applied and before anything of them runs:
#                    every module entry the agent added that would shadow another
#                    module is removed (a package's `__init__`, so that its directory
#                    is a namespace portion again and nothing else of it goes), one
#                    `rollout-guard-removed` line each (`rollout-guard-refused` for one
#                    that could not be), and the runtime guard's sets are written
#                    (DIR/expected, DIR/known). FILES
#                    is a JSON list of the paths the grader itself writes (hidden tests,
#                    the test patch's files), which count as the workspace's own. Runs
#                    with -I -S: nothing of the workspace can be on its path.
#
# A module entry is what Python's path finder resolves a name to in one directory: a
# source file `x.py`, an extension module `x.<suffix>`, or a package `x/__init__.py`.
# A directory without `__init__` is a namespace portion, which never takes precedence
# over a module anywhere on the path, so it is not an entry.
import importlib.machinery
import json
import os
import sys

EXTENSIONS = sorted(
    set(importlib.machinery.EXTENSION_SUFFIXES) | {".so", ".pyd"},
    key=len,
    reverse=True,
)
MAX_ENTRIES = 400000


def entry_of(name):
    """(stem, kind) of a file name that is a module entry, else None."""
    if name.endswith(".py"):
        return name[:-3], "source"
    for suffix in EXTENSIONS:
        if name.endswith(suffix):
            return name[: -len(suffix)], "extension"
    return None


def identifier(stem):
    return stem.isidentifier() and stem != "__init__" and stem != "__main__"


def walk(root):
    """The module-shaped paths under root, relative: files `d/x.py`, `d/x.<ext>`
    (including `__init__` files, which make their directory a package)."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in (".git", "__pycache__")]
        rel = os.path.relpath(d, root)
        rel = "" if rel == "." else rel + "/"
        for f in files:
            if entry_of(f):
                out.append(rel + f)
                if len(out) >= MAX_ENTRIES:
                    return out
    return out


def path_capable(d, inits):
    """Whether directory `d` (relative, "" the root) could be a sys.path entry: the
    root, or a directory that is not a regular package (runners put the first
    directory above a test that has no `__init__` on the path)."""
    return d == "" or d not in inits


def probe(out_dir):
    root = os.getcwd()
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "baseline"), "w", errors="surrogateescape") as f:
        f.write("\n".join(walk(root)))
    names = set(sys.builtin_module_names)
    names.update(getattr(sys, "stdlib_module_names", ()))
    import pkgutil

    real_root = os.path.realpath(root)
    for p in sys.path:
        if not p or not os.path.isdir(p):
            continue
        rp = os.path.realpath(p)
        if rp == real_root or rp.startswith(real_root + os.sep):
            continue  # the workspace's own (PYTHONPATH into it, an editable install)
        for m in pkgutil.iter_modules([p]):
            names.add(m.name)
    # An editable install's names are the repository's own: its path entry (a `.pth`
    # line) is inside the workspace and skipped above, and a finder-based one
    # (`__editable__`) lists no module file in site-packages, so neither is reserved.
    with open(os.path.join(out_dir, "reserved"), "w", errors="surrogateescape") as f:
        f.write("\n".join(sorted(names)))
    print("rollout-guard-python %d.%d %s" % (sys.version_info[0], sys.version_info[1], root))


def read_lines(path):
    try:
        with open(path, errors="surrogateescape") as f:
            return [l for l in f.read().split("\n") if l]
    except OSError:
        return []


def key_of(path):
    """((dir, stem), kind) of a module-shaped path, or None: `d/x.py` is (d, x), a
    package's `d/x/__init__.py` is (d, x), kind `package`."""
    d, _, name = path.rpartition("/")
    e = entry_of(name)
    if not e:
        return None
    stem, kind = e
    if stem == "__init__":
        if not d:
            return None
        d, _, stem = d.rpartition("/")
        kind = "extension" if kind == "extension" else "package"
    if not identifier(stem):
        return None
    return (d, stem), kind


def sweep(out_dir, grader_files):
    root = os.getcwd()
    baseline = read_lines(os.path.join(out_dir, "baseline"))
    reserved = set(read_lines(os.path.join(out_dir, "reserved")))
    expected = set(baseline) | set(grader_files)
    now = walk(root)
    # Directories that are regular packages, at the baseline or now.
    packages = set()
    for p in list(expected) + now:
        k = key_of(p)
        if k and p.rpartition("/")[2].startswith("__init__."):
            packages.add((k[0][0] + "/" if k[0][0] else "") + k[0][1])
    by_key = {}
    for p in sorted(expected):
        k = key_of(p)
        if k:
            by_key.setdefault(k[0], []).append(p)
    own_top = {}
    for (d, stem), paths in sorted(by_key.items()):
        if path_capable(d, packages):
            own_top.setdefault(stem, paths[0])
    refused = []
    for p in sorted(now):
        k = key_of(p)
        if not k or p in expected:
            continue
        (d, stem), kind = k
        why = None
        if kind == "extension":
            why = "an extension module the agent added (compiled code the grader cannot read)"
        elif (d, stem) in by_key:
            why = "shadows %s, a module of the same name in the same directory" % by_key[(d, stem)][0]
        elif path_capable(d, packages):
            if stem in reserved:
                why = "shadows `%s` of the standard library or an installed package" % stem
            elif stem in own_top:
                why = "shadows the workspace's own module `%s` (%s)" % (stem, own_top[stem])
        if why:
            refused.append((p, why))
    for name, lines in (
        ("expected", sorted(expected)),
        ("known", sorted(reserved | set(own_top))),
        ("root", [root]),
    ):
        with open(os.path.join(out_dir, name), "w", errors="surrogateescape") as f:
            f.write("\n".join(lines))
    out = sys.stdout.buffer
    for p, why in refused:
        try:
            os.remove(os.path.join(root, p))
            kind = "removed"
        except OSError as e:
            kind, why = "refused", "%s (it could not be removed: %s)" % (why, e)
        line = "rollout-guard-%s\t%s\t%s\n" % (kind, p.replace("\t", " ").replace("\n", " "), why)
        out.write(line.encode("utf-8", "backslashreplace"))
    out.write(("rollout-guard-swept %d\n" % len(now)).encode())
    out.flush()


if __name__ == "__main__":
    if sys.argv[1] == "probe":
        probe(sys.argv[2])
    else:
        sweep(sys.argv[2], json.loads(sys.argv[3]) if len(sys.argv) > 3 else [])
