#!/usr/bin/env python3
"""Per test binary: how many tests ran, how many failed, and the sum and the largest of
their times, read from the JUnit report cargo-nextest writes (.config/nextest.toml). The
test command prints it after each pass; BENCHMARKS.md's test-suite table is made of it.

The binaries' tests run side by side in one pool, so a binary has no wall time of its
own: the sum says what it costs, the largest which test bounds the pass.

    test-times.py target/nextest/default/junit.xml [--markdown]
"""

import argparse
import sys
import xml.etree.ElementTree as ET


def rows(path):
    root = ET.parse(path).getroot()
    out = []
    for suite in root.iter("testsuite"):
        cases = list(suite.iter("testcase"))
        times = [(float(c.get("time", "0")), c.get("name", "")) for c in cases]
        failed = sum(1 for c in cases if c.find("failure") is not None or c.find("error") is not None)
        slowest = max(times, default=(0.0, ""))
        out.append((suite.get("name", "?"), len(cases), failed, sum(t for t, _ in times), slowest))
    return sorted(out, key=lambda r: -r[3])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report", help="the JUnit XML file")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = ap.parse_args()
    try:
        table = rows(args.report)
    except (OSError, ET.ParseError) as e:
        print(f"test-times: cannot read {args.report}: {e}", file=sys.stderr)
        return 1
    total = (sum(r[1] for r in table), sum(r[2] for r in table), sum(r[3] for r in table))
    if args.markdown:
        print("| binary | tests | failed | sum of test times | slowest test |")
        print("|---|---:|---:|---:|---|")
        for name, n, failed, s, (t, slow) in table:
            print(f"| `{name}` | {n} | {failed} | {s:.0f} s | `{slow}` ({t:.0f} s) |")
        print(f"| all | {total[0]} | {total[1]} | {total[2]:.0f} s | |")
    else:
        for name, n, failed, s, (t, slow) in table:
            print(f"{name:40} {n:4} tests {failed:3} failed {s:7.1f} s  slowest {t:6.1f} s {slow}")
        print(f"{'all':40} {total[0]:4} tests {total[1]:3} failed {total[2]:7.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
