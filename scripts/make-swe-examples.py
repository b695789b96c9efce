#!/usr/bin/env python3
"""Five tiny Python repositories in SWE-bench's instance format, for the `swe` grader's
examples and tests.

    python3 scripts/make-swe-examples.py --repos DIR           # build the repositories
    python3 scripts/make-swe-examples.py --repos DIR --write   # and rewrite the files below

Each repository is built in DIR/<name> as a git repository with one commit made with
fixed names and dates, so its commit id is the same on every machine; building checks it
against examples/swe/instances.jsonl (SWE-bench records: instance_id, repo, base_commit,
patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS, environment_setup_commit,
problem_statement). examples/swe/patches.json holds, per instance, patches an agent
might send: `gold` (the fix), `wrong` (a plausible fix that is not one), `edit_tests`
(the wrong fix plus the named tests rewritten to pass), `delete_tests` (the wrong fix
plus the test files deleted), `precreate_tests` (the wrong fix plus, first, the test
file the test patch will add, written to pass) and `conftest` (the wrong fix plus a
conftest.py that reports every test passed). Only `gold` should score 1.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "examples", "swe")

GIT_ENV = {
    "GIT_AUTHOR_NAME": "rollout examples",
    "GIT_AUTHOR_EMAIL": "examples@rollout.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "rollout examples",
    "GIT_COMMITTER_EMAIL": "examples@rollout.invalid",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_SYSTEM": "/dev/null",
}

# Each repository: its files at base_commit, the fix, a wrong fix, and the test files as
# the test patch leaves them. FAIL_TO_PASS / PASS_TO_PASS are pytest node ids.
REPOS = [
    {
        "name": "clamp",
        "problem": "clamp(x, lo, hi) returns x when x is above hi; it should return hi.",
        "base": {
            "numkit/__init__.py": "from .core import clamp\n",
            "numkit/core.py": "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    return x\n",
            "tests/test_core.py": "from numkit import clamp\n\n\ndef test_inside():\n    assert clamp(5, 0, 10) == 5\n\n\ndef test_below():\n    assert clamp(-3, 0, 10) == 0\n",
        },
        "gold": {"numkit/core.py": "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n"},
        "wrong": {"numkit/core.py": "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi - 1\n    return x\n"},
        "tests": {"tests/test_core.py": "from numkit import clamp\n\n\ndef test_inside():\n    assert clamp(5, 0, 10) == 5\n\n\ndef test_below():\n    assert clamp(-3, 0, 10) == 0\n\n\ndef test_above():\n    assert clamp(42, 0, 10) == 10\n"},
        "f2p": ["tests/test_core.py::test_above"],
        "p2p": ["tests/test_core.py::test_inside", "tests/test_core.py::test_below"],
    },
    {
        "name": "slug",
        "problem": "slugify() keeps capital letters and punctuation; slugs must be lowercase words joined by dashes.",
        "base": {
            "slug.py": "def slugify(text):\n    return '-'.join(text.split())\n",
            "tests/test_slug.py": "from slug import slugify\n\n\ndef test_spaces():\n    assert slugify('a b  c') == 'a-b-c'\n",
        },
        "gold": {"slug.py": "import re\n\n\ndef slugify(text):\n    words = re.findall(r'[a-z0-9]+', text.lower())\n    return '-'.join(words)\n"},
        "wrong": {"slug.py": "def slugify(text):\n    return '-'.join(text.lower().split())\n"},
        "tests": {
            "tests/test_slug.py": "from slug import slugify\n\n\ndef test_spaces():\n    assert slugify('a b  c') == 'a-b-c'\n\n\ndef test_case():\n    assert slugify('Hello World') == 'hello-world'\n",
            "tests/test_punct.py": "from slug import slugify\n\n\ndef test_punctuation():\n    assert slugify('Hello, World!') == 'hello-world'\n",
        },
        "f2p": ["tests/test_slug.py::test_case", "tests/test_punct.py::test_punctuation"],
        "p2p": ["tests/test_slug.py::test_spaces"],
    },
    {
        "name": "stack",
        "problem": "Stack.pop() on an empty stack returns None; it should raise IndexError('pop from empty stack').",
        "base": {
            "stack.py": "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n        self.items.append(x)\n\n    def pop(self):\n        if not self.items:\n            return None\n        return self.items.pop()\n",
            "tests/test_stack.py": "from stack import Stack\n\n\ndef test_lifo():\n    s = Stack()\n    s.push(1)\n    s.push(2)\n    assert s.pop() == 2\n    assert s.pop() == 1\n",
        },
        "gold": {"stack.py": "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n        self.items.append(x)\n\n    def pop(self):\n        if not self.items:\n            raise IndexError('pop from empty stack')\n        return self.items.pop()\n"},
        "wrong": {"stack.py": "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n        self.items.append(x)\n\n    def pop(self):\n        return self.items.pop(0)\n"},
        "tests": {"tests/test_stack.py": "import pytest\n\nfrom stack import Stack\n\n\ndef test_lifo():\n    s = Stack()\n    s.push(1)\n    s.push(2)\n    assert s.pop() == 2\n    assert s.pop() == 1\n\n\ndef test_empty():\n    with pytest.raises(IndexError, match='empty'):\n        Stack().pop()\n"},
        "f2p": ["tests/test_stack.py::test_empty"],
        "p2p": ["tests/test_stack.py::test_lifo"],
    },
    {
        "name": "leap",
        "problem": "is_leap(1900) is True; century years are leap years only when divisible by 400.",
        "base": {
            "calendar_tools/__init__.py": "",
            "calendar_tools/leap.py": "def is_leap(year):\n    return year % 4 == 0\n",
            "tests/test_leap.py": "import pytest\n\nfrom calendar_tools.leap import is_leap\n\n\n@pytest.mark.parametrize('year', [2024, 1996])\ndef test_leap(year):\n    assert is_leap(year)\n",
        },
        "gold": {"calendar_tools/leap.py": "def is_leap(year):\n    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n"},
        "wrong": {"calendar_tools/leap.py": "def is_leap(year):\n    return year % 4 == 0 and year % 100 != 0\n"},
        "tests": {"tests/test_leap.py": "import pytest\n\nfrom calendar_tools.leap import is_leap\n\n\n@pytest.mark.parametrize('year', [2024, 1996])\ndef test_leap(year):\n    assert is_leap(year)\n\n\n@pytest.mark.parametrize('year', [1900, 2100])\ndef test_century(year):\n    assert not is_leap(year)\n\n\ndef test_2000():\n    assert is_leap(2000)\n"},
        "f2p": ["tests/test_leap.py::test_century[1900]", "tests/test_leap.py::test_century[2100]", "tests/test_leap.py::test_2000"],
        "p2p": ["tests/test_leap.py::test_leap[2024]", "tests/test_leap.py::test_leap[1996]"],
    },
    {
        "name": "cart",
        "problem": "Cart.total() ignores quantities: two of an item priced 3 should cost 6.",
        "base": {
            "shop/__init__.py": "",
            "shop/cart.py": "class Cart:\n    def __init__(self):\n        self.lines = []\n\n    def add(self, price, qty=1):\n        self.lines.append((price, qty))\n\n    def total(self):\n        return sum(price for price, _ in self.lines)\n",
            "tests/__init__.py": "",
            "tests/test_cart.py": "from shop.cart import Cart\n\n\nclass TestCart:\n    def test_empty(self):\n        assert Cart().total() == 0\n\n    def test_single(self):\n        c = Cart()\n        c.add(5)\n        assert c.total() == 5\n",
        },
        "gold": {"shop/cart.py": "class Cart:\n    def __init__(self):\n        self.lines = []\n\n    def add(self, price, qty=1):\n        self.lines.append((price, qty))\n\n    def total(self):\n        return sum(price * qty for price, qty in self.lines)\n"},
        "wrong": {"shop/cart.py": "class Cart:\n    def __init__(self):\n        self.lines = []\n\n    def add(self, price, qty=1):\n        self.lines.append((price, qty))\n\n    def total(self):\n        return sum(price + qty - 1 for price, qty in self.lines)\n"},
        "tests": {"tests/test_cart.py": "from shop.cart import Cart\n\n\nclass TestCart:\n    def test_empty(self):\n        assert Cart().total() == 0\n\n    def test_single(self):\n        c = Cart()\n        c.add(5)\n        assert c.total() == 5\n\n    def test_quantity(self):\n        c = Cart()\n        c.add(3, qty=2)\n        c.add(4, qty=3)\n        assert c.total() == 18\n"},
        "f2p": ["tests/test_cart.py::TestCart::test_quantity"],
        "p2p": ["tests/test_cart.py::TestCart::test_empty", "tests/test_cart.py::TestCart::test_single"],
    },
]

FORGING_CONFTEST = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
"""


def git(cwd, *args, check=True):
    env = dict(os.environ, **GIT_ENV)
    out = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if check and out.returncode != 0:
        sys.exit(f"git {' '.join(args)} failed in {cwd}: {out.stderr.strip()}")
    return out.stdout


def write(root, files):
    for path, content in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full) or root, exist_ok=True)
        if content is None:
            os.remove(full)
        else:
            with open(full, "w") as f:
                f.write(content)


def build(dest, repo):
    """Builds the repository; returns its commit id."""
    path = os.path.join(dest, repo["name"])
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)
    git(path, "init", "--quiet", "--initial-branch=main")
    write(path, repo["base"])
    git(path, "add", "-A")
    git(path, "commit", "--quiet", "-m", f"{repo['name']}: the code before the fix")
    return git(path, "rev-parse", "HEAD").strip()


def diff_of(base_repo, changes, steps=()):
    """The diff an agent's changes make over the base: `changes` (path -> content, or
    None to delete) applied after each of `steps`."""
    with tempfile.TemporaryDirectory() as tmp:
        work = os.path.join(tmp, "w")
        git(tmp, "clone", "--quiet", base_repo, work)
        for step in steps:
            write(work, step)
        write(work, changes)
        git(work, "add", "-A")
        return git(work, "diff", "--cached", "--binary", "HEAD")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repos", required=True, help="directory the repositories are built in")
    ap.add_argument("--write", action="store_true", help="rewrite examples/swe/*")
    a = ap.parse_args()
    dest = os.path.abspath(a.repos)
    os.makedirs(dest, exist_ok=True)
    instances, patches = [], {}
    for repo in REPOS:
        commit = build(dest, repo)
        path = os.path.join(dest, repo["name"])
        iid = f"rollout-examples__{repo['name']}-1"
        wrong = repo["wrong"]
        # The named tests rewritten to pass, whatever the code does.
        forged = {}
        for name in repo["f2p"] + repo["p2p"]:
            file = name.split("::")[0]
            forged.setdefault(file, "")
        for file in forged:
            fns = sorted({n.split("::")[-1].split("[")[0] for n in repo["f2p"] + repo["p2p"] if n.startswith(file)})
            forged[file] = "".join(f"def {fn}(*args, **kwargs):\n    pass\n\n\n" for fn in fns)
        test_files = [f for f in repo["base"] if f.startswith("tests/") and f.endswith(".py") and "__init__" not in f]
        instances.append({
            "instance_id": iid,
            "repo": f"rollout-examples/{repo['name']}",
            "base_commit": commit,
            "patch": diff_of(path, repo["gold"]),
            "test_patch": diff_of(path, repo["tests"]),
            "FAIL_TO_PASS": json.dumps(repo["f2p"]),
            "PASS_TO_PASS": json.dumps(repo["p2p"]),
            "environment_setup_commit": commit,
            "problem_statement": repo["problem"],
        })
        patches[iid] = {
            "gold": diff_of(path, repo["gold"]),
            "wrong": diff_of(path, wrong),
            "edit_tests": diff_of(path, {**wrong, **forged}),
            "delete_tests": diff_of(path, {**wrong, **{f: None for f in test_files}}),
            "precreate_tests": diff_of(path, {**wrong, **{f: forged.get(f, "def test_x():\n    pass\n") for f in repo["tests"] if f not in repo["base"]}}),
            "conftest": diff_of(path, {**wrong, "conftest.py": FORGING_CONFTEST, "tests/conftest.py": FORGING_CONFTEST}),
        }
    if a.write:
        os.makedirs(OUT, exist_ok=True)
        with open(os.path.join(OUT, "instances.jsonl"), "w") as f:
            for i in instances:
                f.write(json.dumps(i) + "\n")
        with open(os.path.join(OUT, "patches.json"), "w") as f:
            json.dump(patches, f, indent=1, sort_keys=True)
            f.write("\n")
        return
    # Check the committed instances name these commits.
    with open(os.path.join(OUT, "instances.jsonl")) as f:
        committed = {json.loads(l)["instance_id"]: json.loads(l)["base_commit"] for l in f if l.strip()}
    for i in instances:
        if committed.get(i["instance_id"]) != i["base_commit"]:
            sys.exit(f"{i['instance_id']}: built commit {i['base_commit']} but examples/swe/instances.jsonl says {committed.get(i['instance_id'])}")
    print(f"built {len(instances)} repositories in {dest}")


if __name__ == "__main__":
    main()
