#!/usr/bin/env python3
"""HuggingFace math-verify's verdicts on the math grading set, for comparison.

Reads the cases of a TOML file (tests/data/math_grading.toml) and prints one JSON
object per case, in order: {"correct": bool, "seconds": float}. The ground truth is
parsed as math-verify's users do (`parse("$" + truth + "$")`) and the response with
math-verify's default extraction (`parse(response)`), then `verify(gold, answer)`.

Needs `pip install math-verify` (scripts/setup.sh installs it).
"""

import json
import sys
import time
import tomllib

from math_verify import parse, verify


def main() -> None:
    path = sys.argv[1]
    with open(path, "rb") as f:
        cases = tomllib.load(f)["case"]
    for case in cases:
        start = time.perf_counter()
        try:
            gold = parse("$" + case["truth"] + "$")
            answer = parse(case["response"])
            correct = bool(verify(gold, answer))
        except Exception:  # math-verify raising is its verdict "not verified"
            correct = False
        seconds = time.perf_counter() - start
        print(json.dumps({"correct": correct, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
