# The persistent interpreter behind the sandbox server's `python` tool.
#
# The driver runs isolated (python -I) from the server's private directory, so no file in
# the workspace can shadow a module it imports; it makes itself undumpable (no ptrace, no
# /proc/<pid>/mem for the agent's processes), then reads its marker token as the first
# line of file descriptor 3, and only then moves to the workspace.
#
# Requests arrive on file descriptor 3, one JSON object per line: {"seq": n, "code": "..."}.
# The cell's stdout and stderr (and its subprocesses') go to fd 1 and 2, which the server
# reads. When a cell is done the driver flushes both and writes one end marker to fd 1:
#   \x1e<token>:<seq>:<json result>\x1e
# so the output and the result travel on one ordered channel. json.dumps escapes control
# characters, so the result itself never contains the \x1e terminator. Standard input is
# /dev/null: a cell that calls input() gets EOFError instead of hanging.
#
# With IPython importable, cells run through InteractiveShell.run_cell (magics, `!cmd`,
# IPython tracebacks); otherwise through plain exec/eval with the same contract.
import ast
import json
import linecache
import os
import signal
import sys
import traceback


def undumpable():
    try:
        import ctypes

        PR_SET_DUMPABLE = 4
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except Exception:
        pass


undumpable()
TOKEN = ""  # read from fd 3 in main()
ENGINE = os.environ.pop("ROLLOUT_PY_ENGINE", "auto")
WORKDIR = os.environ.pop("ROLLOUT_PY_WORKDIR", None)


def strip_driver_frames(tb):
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    return tb


class Plain:
    name = "cpython"

    def __init__(self):
        self.ns = {"__name__": "__main__", "__builtins__": __builtins__}
        self.n = 0

    def run(self, code):
        self.n += 1
        fname = "<cell %d>" % self.n
        linecache.cache[fname] = (len(code), None, code.splitlines(True), fname)
        try:
            tree = ast.parse(code, fname, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, fname, "exec"), self.ns)
            if last is not None:
                value = eval(compile(last, fname, "eval"), self.ns)
                if value is not None:
                    self.ns["_"] = value
                    return {"value": repr(value)}
            return {}
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: report, go on
            tb = strip_driver_frames(e.__traceback__)
            return {"error": "".join(traceback.format_exception(type(e), e, tb)).rstrip()}


class IPy:
    name = "ipython"

    def __init__(self):
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config

        # History in memory: no SQLite file in the sandbox, no writer thread.
        config = Config()
        config.HistoryManager.hist_file = ":memory:"
        sh = InteractiveShell.instance(colors="NoColor", config=config)
        self.sh = sh
        self.tb = None

        def keep_traceback(etype, evalue, stb):
            self.tb = "\n".join(stb)

        sh._showtraceback = keep_traceback
        # The value comes back as `value`; do not also print "Out[n]: ...".
        sh.displayhook.write_output_prompt = lambda: None
        sh.displayhook.write_format_data = lambda *a, **k: None
        sh.displayhook.compute_format_data = lambda result: ({"text/plain": repr(result)}, {})

    def run(self, code):
        self.tb = None
        # store_history=True would cost about 1 ms a cell (In/Out bookkeeping and the
        # history database); `_` still holds the last value without it.
        r = self.sh.run_cell(code, store_history=False)
        out = {}
        if self.tb is not None:
            out["error"] = self.tb.rstrip()
        elif r.error_before_exec is not None or r.error_in_exec is not None:
            e = r.error_in_exec or r.error_before_exec
            out["error"] = "".join(traceback.format_exception_only(type(e), e)).rstrip()
        if r.result is not None and "error" not in out:
            try:
                out["value"] = repr(r.result)
            except BaseException as e:
                out["error"] = "repr failed: %r" % (e,)
        return out


def make_engine():
    if ENGINE in ("auto", "ipython"):
        try:
            return IPy()
        except ImportError:
            if ENGINE == "ipython":
                raise
    return Plain()


def send(seq, result):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    data = ("\x1e%s:%d:%s\x1e" % (TOKEN, seq, json.dumps(result))).encode()
    while data:
        data = data[os.write(1, data):]


def main():
    # SIGINT interrupts cells only: the server sends it when a cell times out, and one
    # that arrives late, between cells, must not kill the driver.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.set_inheritable(3, False)
    requests = os.fdopen(3, "r", encoding="utf-8")
    global TOKEN
    TOKEN = requests.readline().strip()
    engine = make_engine()
    if WORKDIR:
        # Cells work in the workspace and import from it, as in a notebook there.
        os.chdir(WORKDIR)
        sys.path.insert(0, WORKDIR)
    send(0, {"engine": engine.name})
    while True:
        try:
            line = requests.readline()
        except KeyboardInterrupt:  # a late interrupt between cells
            continue
        if not line:
            return
        req = json.loads(line)
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            result = engine.run(req["code"])
        except KeyboardInterrupt:
            result = {"error": "KeyboardInterrupt"}
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            try:
                send(req["seq"], result)
                break
            except KeyboardInterrupt:
                continue


main()
