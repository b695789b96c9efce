"""The client as a published package: a wheel built from this directory, installed into
a fresh virtual environment, imports from there with its version, its `py.typed`
marker (PEP 561: type checkers read its annotations) and its adapters, and its
metadata names it as an index would list it."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
CI = os.environ.get("CI") == "true"


def source_version():
    """`__version__` as the source declares it, read without importing the package."""
    for line in (HERE / "rollout_client" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip('"')
    raise AssertionError("no __version__ in rollout_client/__init__.py")


class WheelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        out = Path(cls.tmp.name) / "dist"
        # Built from a clean copy: setuptools reuses a `build/` directory, so a file
        # deleted from the source could live on in a wheel built in place.
        src = Path(cls.tmp.name) / "src"
        shutil.copytree(HERE, src, ignore=shutil.ignore_patterns(
            "build", "*.egg-info", "__pycache__", "tests"))
        # pip fetches the build backend (setuptools) from the index, as a user's pip does.
        build = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
             "--disable-pip-version-check", "-w", str(out), str(src)],
            capture_output=True, text=True, timeout=600,
        )
        if build.returncode != 0:
            message = "building the wheel failed:\n" + build.stderr[-3000:]
            if CI:
                raise AssertionError(message)
            raise unittest.SkipTest(message)
        wheels = list(out.glob("rollout_client-*.whl"))
        assert len(wheels) == 1, wheels
        cls.wheel = wheels[0]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_the_wheel_holds_the_package_its_marker_and_its_metadata(self):
        version = source_version()
        self.assertEqual(self.wheel.name, f"rollout_client-{version}-py3-none-any.whl")
        with zipfile.ZipFile(self.wheel) as z:
            names = set(z.namelist())
            for name in ["rollout_client/__init__.py", "rollout_client/py.typed",
                         "rollout_client/types.py", "rollout_client/local.py",
                         "rollout_client/adapters/__init__.py",
                         "rollout_client/adapters/verl.py",
                         "rollout_client/adapters/slime.py",
                         "rollout_client/adapters/skyrl.py"]:
                self.assertIn(name, names)
            self.assertFalse([n for n in names if n.startswith("tests/")], names)
            meta = z.read(f"rollout_client-{version}.dist-info/METADATA").decode()
        self.assertIn("Name: rollout-client", meta)
        self.assertIn(f"Version: {version}", meta)
        self.assertIn("Requires-Python: >=3.9", meta)
        self.assertIn("Classifier: Typing :: Typed", meta)
        self.assertIn("Provides-Extra: torch", meta)

    def test_installed_into_a_fresh_environment_it_imports_from_there(self):
        venv = Path(self.tmp.name) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        py = venv / "bin" / "python"
        subprocess.run(
            [str(py), "-m", "pip", "install", "--no-deps", "--quiet",
             "--disable-pip-version-check", str(self.wheel)],
            check=True, timeout=300,
        )
        # From elsewhere, so the source tree is not what gets imported.
        probe = subprocess.run(
            [str(py), "-c",
             "import importlib.metadata as m, pathlib, rollout_client, rollout_client.adapters;"
             "print(rollout_client.__version__, m.version('rollout-client'),"
             " pathlib.Path(rollout_client.__file__).parent.joinpath('py.typed').exists(),"
             " rollout_client.__file__)"],
            capture_output=True, text=True, cwd=self.tmp.name, check=True, timeout=60,
        )
        version, dist_version, typed, path = probe.stdout.split()
        self.assertEqual((version, dist_version, typed), (source_version(), source_version(), "True"))
        self.assertTrue(path.startswith(str(venv)), path)


if __name__ == "__main__":
    unittest.main()
