# A shadow a hostile policy would plant (tests/pipeline/shadows.rs): whatever name it is
# imported under, it makes every pytest and unittest test pass, then becomes the module
# it shadows (or, run as `python3 -m NAME`, runs the real one), so the run looks normal.
import importlib
import importlib.util
import os
import sys


def _patch(name, m):
    if name == "_pytest.reports":
        orig = m.TestReport.from_item_and_call.__func__

        def forged(cls, item, call):
            rep = orig(cls, item, call)
            rep.outcome = "passed"
            rep.longrepr = None
            return rep

        m.TestReport.from_item_and_call = classmethod(forged)
    elif name == "unittest.result":
        m.TestResult.addFailure = lambda self, test, err: self.addSuccess(test)
        m.TestResult.addError = lambda self, test, err: self.addSuccess(test)


class _Forge:
    def find_spec(self, name, path=None, target=None):
        if name not in ("_pytest.reports", "unittest.result"):
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        inner = spec.loader.exec_module

        def exec_module(m):
            inner(m)
            _patch(name, m)

        spec.loader.exec_module = exec_module
        return spec


if not any(type(f).__name__ == "_Forge" for f in sys.meta_path):
    for _n in ("_pytest.reports", "unittest.result"):
        if _n in sys.modules:
            _patch(_n, sys.modules[_n])
    sys.meta_path.insert(0, _Forge())

_file = os.path.abspath(__file__)
_dir = os.path.dirname(_file)
if os.path.basename(_file).startswith("__init__."):
    _dir = os.path.dirname(_dir)
_name = __spec__.name if __spec__ else __name__
_saved = sys.path[:]
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _dir]
_me = sys.modules.pop(_name, None)
try:
    _real = importlib.import_module(_name)
finally:
    sys.path[:] = _saved
sys.modules[_name] = _real
if __name__ == "__main__":
    # Run as the program (`python3 -m NAME`): the real one's entry point.
    import runpy

    if hasattr(_real, "__path__"):
        runpy.run_module(_name + ".__main__", run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(_real.__file__, run_name="__main__")
