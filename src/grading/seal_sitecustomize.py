# The grader's own bootstrap for a test run (the directory holding this file is first on
# PYTHONPATH): the import guard, then the completion seal. Anything that goes wrong here
# leaves the run untouched.
#
# The completion seal: loaded by Python at start (this directory is first on
# PYTHONPATH) in a test run the grader is about to read. The first Python process to
# start claims a secret the grader wrote for this run (the file is read, then removed,
# before any code under test is imported) and prints an opening mark; when that process
# ends the ordinary way (the runner returned and the interpreter is shutting down), it
# prints the secret after everything the runner wrote. A process ended by os._exit, a
# signal or a crash never prints it, so a log forged by the code under test followed by
# such an exit has no seal. Anything that goes wrong here leaves the run untouched.
#
# A runner that lets SystemExit through (unittest's and Django's loaders, sympy's
# runner) would also end "the ordinary way" when the code under test calls sys.exit
# after printing a forged log. When the grader names the runner (ROLLOUT_SEAL_RUNNER),
# the seal also records whether the runner's run returned, and says "unfinished" when
# it did not.


def _rollout_others(me, name, path, target):
    # The spec the finders after `me` on sys.meta_path give for `name` (the finders
    # here delegate to each other: a finder already asking is skipped).
    import sys

    local = _rollout_others.__dict__.get("local")
    if local is None:
        import _thread

        local = _rollout_others.__dict__.setdefault("local", _thread._local())
    busy = local.__dict__.setdefault("busy", set())
    key = (id(me), name)
    if key in busy:
        return None
    busy.add(key)
    try:
        for finder in list(sys.meta_path):
            if finder is me:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                return spec
        return None
    finally:
        busy.discard(key)


def _rollout_guard():
    # The import guard (guard.rs): with ROLLOUT_GUARD naming the directory the grader's
    # sweep wrote, every module this process imports from the workspace is checked
    # against what the grader expected there: a module file the agent added that is an
    # extension module, that takes the place of an expected module of the same name in
    # the same directory, or that is a top-level module under a name the standard
    # library, an installed package or another directory of the workspace already
    # gives, is refused (the import fails) and recorded (a line on the original stderr
    # and in the directory's `refused`). Under safe-path mode (PYTHONSAFEPATH) the
    # directory Python would have put first on the path goes after the standard
    # library instead, so the repository's own modules still import and none of them
    # shadows the standard library.
    import importlib.machinery
    import os
    import sys

    where = os.environ.get("ROLLOUT_GUARD")
    if not where:
        return

    def lines(name):
        with open(os.path.join(where, name), errors="surrogateescape") as f:
            return [l for l in f.read().split("\n") if l]

    try:
        expected = set(lines("expected"))
        known = set(lines("known"))
        root = os.path.abspath(lines("root")[0])
        err = os.dup(2)
    except (OSError, IOError, IndexError):
        return
    if getattr(sys.flags, "safe_path", False):
        first = sys.argv[0] if sys.argv else ""
        if first and first not in ("-c", "-m", "-"):
            first = os.path.dirname(os.path.abspath(first))
        else:
            first = os.getcwd()
        if first not in sys.path:
            # After the standard library (which it may never shadow) and before the
            # installed packages: the repository's own modules, as they were before the
            # agent (the sweep refuses any it added under an installed name), keep the
            # precedence the working directory gave them.
            std = os.path.dirname(os.path.abspath(os.__file__))
            at = 0
            for i, p in enumerate(sys.path):
                a = os.path.abspath(p or ".")
                if a == std or a.startswith(std + os.sep) or (
                    a.endswith(".zip") and os.path.dirname(a) == os.path.dirname(std)
                ):
                    at = i + 1
            sys.path.insert(at, first)
    extensions = tuple(importlib.machinery.EXTENSION_SUFFIXES) + (".so", ".pyd")

    def key(rel):
        d, _, f = rel.rpartition("/")
        stem = f.split(".", 1)[0]
        if stem == "__init__":
            d, _, stem = d.rpartition("/")
        return d, stem

    keys = {}
    for p in expected:
        if p.endswith(".py") or p.endswith(extensions):
            keys.setdefault(key(p), p)

    def inside(origin):
        # The workspace-relative path of a module's file, or None outside it.
        if not origin:
            return None
        a = os.path.abspath(origin)
        if not a.startswith(root + os.sep):
            return None
        return a[len(root) + 1 :]

    def verdict(name, origin):
        rel = inside(origin)
        if rel is None or rel in expected:
            return None
        if rel.endswith(extensions):
            return rel, "an extension module the agent added"
        k = key(rel)
        if k in keys:
            return rel, "shadows %s, a module of the same name in the same directory" % keys[k]
        if "." not in name and name in known:
            return rel, "shadows `%s`, which the grader expected from elsewhere" % name
        return None

    def record(name, found):
        line = "rollout-guard-refused\t%s\t%s (imported as `%s`)\n" % (found[0], found[1], name)
        line = line.encode("utf-8", "backslashreplace")
        try:
            os.write(err, line)
        except OSError:
            pass
        try:
            with open(os.path.join(where, "refused"), "ab") as f:
                f.write(line)
        except (OSError, IOError):
            pass

    class Guard(object):
        def find_spec(self, name, path=None, target=None):
            spec = _rollout_others(self, name, path, target)
            if spec is None or not getattr(spec, "has_location", False):
                return spec
            found = verdict(name, spec.origin)
            if found is None:
                rel = inside(spec.origin)
                if rel is not None:
                    # The record of what the run loaded from the workspace.
                    try:
                        with open(os.path.join(where, "imported"), "a", errors="surrogateescape") as f:
                            f.write(rel + "\n")
                    except (OSError, IOError):
                        pass
                return spec
            record(name, found)
            raise ModuleNotFoundError(
                "rollout's grader refused to import %s from %s: %s" % (name, found[0], found[1]),
                name=name,
            )

    # Modules imported before this ran (PYTHONPATH into the workspace) are recorded.
    for name, module in list(sys.modules.items()):
        found = verdict(name, getattr(module, "__file__", None))
        if found is not None:
            record(name, found)
    sys.meta_path.insert(0, Guard())


def _rollout_after_import(patches):
    # Calls patches[name](module) once module `name` has been executed, whoever
    # imports it: a finder first on sys.meta_path that asks the others for the spec
    # and wraps its loader.
    import sys

    class Loader(object):
        def __init__(self, inner, patch):
            self._inner = inner
            self._patch = patch

        def create_module(self, spec):
            return self._inner.create_module(spec)

        def exec_module(self, module):
            self._inner.exec_module(module)
            try:
                self._patch(module)
            except Exception:
                pass

        def __getattr__(self, name):
            return getattr(self._inner, name)

    class Finder(object):
        def find_spec(self, name, path=None, target=None):
            patch = patches.get(name)
            if patch is None:
                return None
            spec = _rollout_others(self, name, path, target)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            spec.loader = Loader(spec.loader, patch)
            return spec

    sys.meta_path.insert(0, Finder())


def _rollout_runner(runner, done):
    # Makes done() run when the named runner's run returns.
    def after(cls, method):
        inner = getattr(cls, method)

        def wrapper(*args, **kwargs):
            result = inner(*args, **kwargs)
            done()
            return result

        setattr(cls, method, wrapper)

    if runner == "unittest":
        # unittest's TextTestRunner also runs Django's runtests.py (DiscoverRunner).
        import unittest.runner

        after(unittest.runner.TextTestRunner, "run")
    elif runner == "sympy":
        # bin/test runs SymPyTests.test in this process when PYTHONHASHSEED is set.
        def sympy(module):
            after(module.SymPyTests, "test")

        _rollout_after_import(
            {"sympy.testing.runtests": sympy, "sympy.utilities.runtests": sympy}
        )


def _rollout_frame(cls, write, token):
    # The outermost run of unittest's TextTestRunner writes through a stream that
    # frames each of its writes with this run's token, straight to the run's own
    # stderr (a copy of fd 2 taken at start): the grader reads only framed text as the
    # runner's, so lines the code under test prints are never read as results. The
    # token is told only in the seal, after the run. Runs inside a test are left alone.
    import sys

    start = ("[rollout-runner %s[" % token).encode()
    end = ("]rollout-runner %s]" % token).encode()
    inner = cls.run
    depth = [0]

    class Framed(object):
        def __init__(self, stream):
            self._stream = stream

        def write(self, text):
            if not text:
                return
            if not isinstance(text, bytes):
                text = text.encode("utf-8", "replace")
            try:
                sys.stderr.flush()  # what the tests wrote first comes first
            except Exception:
                pass
            write(start + text + end)

        def writeln(self, text=None):
            if text:
                self.write(text)
            self.write("\n")

        def flush(self):
            pass

        def __getattr__(self, name):
            return getattr(self._stream, name)

    def run(self, *args, **kwargs):
        if depth[0]:
            return inner(self, *args, **kwargs)
        depth[0] += 1
        saved = getattr(self, "stream", None)
        self.stream = Framed(saved)
        try:
            return inner(self, *args, **kwargs)
        finally:
            self.stream = saved
            depth[0] -= 1

    cls.run = run


def _rollout_seal():
    import os
    import sys

    runner = os.environ.pop("ROLLOUT_SEAL_RUNNER", "")
    path = os.environ.pop("ROLLOUT_SEAL", None)
    if not path:
        return
    try:
        with open(path) as f:
            secret = f.read().strip()
        os.unlink(path)
    except (OSError, IOError):
        return
    if not secret:
        return
    try:
        import atexit

        try:
            from _thread import get_ident
        except ImportError:
            from thread import get_ident
        out = os.dup(1)
    except Exception:
        return

    def identity(fd):
        try:
            st = os.fstat(fd)
            return (st.st_dev, st.st_ino)
        except (OSError, IOError):
            return None

    finished = [not runner]

    def done():
        finished[0] = True

    if runner:
        try:
            _rollout_runner(runner, done)
        except Exception:
            pass  # the run is then read as unfinished: a runner that is not there
    token = ""
    if runner == "unittest":
        try:
            import binascii
            import unittest.runner

            err, write = os.dup(2), os.write

            def put(data):
                while data:
                    data = data[write(err, data) :]

            token = binascii.hexlify(os.urandom(8)).decode()
            _rollout_frame(unittest.runner.TextTestRunner, put, token)
        except Exception:
            token = ""
    fds = (identity(1), identity(2))
    streams = (sys.stdout, sys.stderr)
    pid = os.getpid()
    main = get_ident()

    def close():
        if os.getpid() != pid:
            return  # a forked child ending: not the run's end
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except Exception:
                pass
        marks = []
        if sys._getframe().f_back is not None or get_ident() != main:
            marks.append("called")  # exit handlers run by the code, not by shutdown
        if (identity(1), identity(2)) != fds:
            marks.append("fds")  # stdout or stderr pointed elsewhere at the end
        if sys.stdout is not streams[0] or sys.stderr is not streams[1]:
            marks.append("streams")  # sys.stdout or sys.stderr replaced at the end
        if not finished[0]:
            marks.append("unfinished")  # the runner's run never returned
        line = "\nrollout-seal %s %s%s\n" % (
            secret,
            ",".join(marks) or "ok",
            " " + token if token else "",
        )
        try:
            os.write(out, line.encode())
        except Exception:
            pass

    try:
        os.write(out, ("\nrollout-seal-open %d\n" % pid).encode())
        atexit.register(close)
    except Exception:
        pass


def _rollout_chain():
    # The environment's own sitecustomize, which this one shadows, still runs.
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.pop("sitecustomize", None)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        __import__("sitecustomize")
    except ImportError:
        pass
    except Exception:
        sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback\n")
    finally:
        sys.path[:] = saved
        if "sitecustomize" not in sys.modules and me is not None:
            sys.modules["sitecustomize"] = me


try:
    _rollout_guard()
except Exception:
    pass
try:
    _rollout_seal()
except Exception:
    pass
_rollout_chain()
del _rollout_guard, _rollout_seal, _rollout_chain, _rollout_runner, _rollout_after_import, _rollout_frame
