#!/usr/bin/env python3
"""What the grader's import guard adds to a graded Python test run.

The guard (src/grading/guard.rs) adds three things to EVAL: a probe before the
agent's changes are applied (one Python start that walks the workspace and lists the
names installed outside it), a sweep after (one isolated Python start that walks the
workspace again), and a finder in the run's bootstrap that looks at every import. This
times each against the test run itself, in the same run, with the sandboxes' Python:
the `clamp` example repository (scripts/make-swe-examples.py) and a large synthetic
workspace (a repository of WIDTH packages of DEPTH modules each).

    python3 scripts/bench-guard.py [--runs 15] [--width 100] [--depth 50]

Prints medians in milliseconds and each as a ratio to the plain test run.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GUARD = os.path.join(ROOT, "src/grading/guard.py")
BOOTSTRAP = os.path.join(ROOT, "src/grading/seal_sitecustomize.py")
PYTHON = "/usr/bin/python3"


def timed(argv, cwd, env, runs):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append((time.perf_counter() - t0) * 1000)
        if r.returncode not in (0, 1):
            sys.exit("%s failed: %s" % (argv, r.stderr.decode(errors="replace")))
    return statistics.median(times)


def environment(extra):
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}
    env.update(extra)
    return env


def measure(name, workspace, test_argv, runs):
    guard_dir = tempfile.mkdtemp(prefix="guard-")
    shutil.copy(BOOTSTRAP, os.path.join(guard_dir, "sitecustomize.py"))
    script = os.path.join(guard_dir, "rollout-guard.py")
    shutil.copy(GUARD, script)
    probe = timed([PYTHON, script, "probe", guard_dir], workspace, environment({}), runs)
    sweep = timed(
        [PYTHON, "-I", "-S", script, "sweep", guard_dir, json.dumps([])],
        workspace,
        environment({}),
        runs,
    )
    plain = timed(test_argv, workspace, environment({"PYTHONPATH": guard_dir}), runs)
    guarded = timed(
        test_argv,
        workspace,
        environment({"PYTHONPATH": guard_dir, "PYTHONSAFEPATH": "1", "ROLLOUT_GUARD": guard_dir}),
        runs,
    )
    shutil.rmtree(guard_dir)
    print("| %s | %.0f | %.0f (%.2fx) | %.0f (%.2fx) | %.0f (%.2fx) | %.2fx |" % (
        name, plain, guarded, guarded / plain, probe, probe / plain, sweep, sweep / plain,
        (guarded + probe + sweep) / plain))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--width", type=int, default=100)
    ap.add_argument("--depth", type=int, default=50)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-guard-")
    try:
        subprocess.run([sys.executable, os.path.join(HERE, "make-swe-examples.py"), "--repos", work],
                       check=True, stdout=subprocess.DEVNULL)
        clamp = os.path.join(work, "clamp")
        big = os.path.join(work, "big")
        shutil.copytree(clamp, big)
        for i in range(args.width):
            pkg = os.path.join(big, "pkg%03d" % i)
            os.makedirs(pkg)
            open(os.path.join(pkg, "__init__.py"), "w").close()
            for j in range(args.depth):
                with open(os.path.join(pkg, "m%03d.py" % j), "w") as f:
                    f.write("X = %d\n" % j)
        test = [PYTHON, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "tests/test_core.py"]
        print("| workspace | test run (ms) | guarded run | probe | sweep | all vs plain |")
        print("|---|---|---|---|---|---|")
        measure("clamp (3 modules)", clamp, test, args.runs)
        measure("clamp + %d modules" % (args.width * (args.depth + 1)), big, test, args.runs)
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
