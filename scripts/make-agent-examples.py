#!/usr/bin/env python3
"""Writes examples/agent.jsonl (agent tasks), examples/math.jsonl, code.jsonl and swe.jsonl
(agent tasks scored by the math, code and swe graders) and examples/agent-policy.json (the
script the stand-in inference server plays for all of them). Tool calls are written exactly as a chat
template's `tojson` writes them back, so re-rendered conversations agree with the tokens.
Run from the repository root: python3 scripts/make-agent-examples.py"""
import json


def call(name, **args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


SYSTEM = "You are a careful software engineer. Use the tools to inspect and change files in the workspace, check your work, then call finish."

tasks = [
    {
        "prompt": "Fix mean() in stats.py so that test_stats.py passes.",
        "files": {
            "stats.py": "def mean(xs):\n    return sum(xs) / (len(xs) - 1)\n",
            "test_stats.py": "from stats import mean\n\nassert mean([1, 2, 3]) == 2\nassert mean([5]) == 5\nprint('ok')\n",
        },
        "check": "python3 test_stats.py",
        "variants": [
            (3, [
                "Let me run the tests first.\n" + call("bash", command="python3 test_stats.py"),
                call("file", command="view", path="stats.py"),
                call("file", command="str_replace", path="stats.py", old_str="len(xs) - 1", new_str="len(xs)"),
                call("bash", command="python3 test_stats.py"),
                call("finish", answer="fixed the denominator"),
            ]),
            (2, [
                call("file", command="view", path="stats.py"),
                call("file", command="str_replace", path="stats.py", old_str="len(xs) - 1", new_str="len(xs) + 1"),
                call("finish", answer="changed the denominator"),
            ]),
            (1, ["The code looks correct to me."]),
        ],
    },
    {
        "prompt": "What is the sum of the squares of 1 to 100? Compute it, then call finish with the number as the answer.",
        "files": {},
        "check": "test \"$ROLLOUT_ANSWER\" = 338350",
        "variants": [
            (1, [
                call("python", code="sum(i * i for i in range(1, 101))"),
                call("finish", answer="338350"),
            ]),
            (1, [
                call("python", code="sum(i * i for i in range(1, 100))"),
                call("finish", answer="328350"),
            ]),
        ],
    },
    {
        "prompt": "Write hello.sh, an executable script that prints hello, world.",
        "files": {},
        "check": "test \"$(./hello.sh)\" = 'hello, world'",
        "variants": [
            (2, [
                call("file", command="create", path="hello.sh", file_text="#!/bin/sh\necho 'hello, world'\n"),
                call("bash", command="chmod +x hello.sh && ./hello.sh"),
                call("finish"),
            ]),
            (1, [
                call("file", command="create", path="hello.sh", file_text="#!/bin/sh\necho hello\n"),
                call("bash", command="./hello.sh"),
                "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": }\n</tool_call>",
                call("finish"),
            ]),
        ],
    },
    {
        "prompt": "Make slugify() in text.py return lowercase words joined by dashes.",
        "files": {
            "text.py": "def slugify(s):\n    return '-'.join(s.split())\n",
        },
        "check": "python3 -c 'from text import slugify; assert slugify(\"Hello Big World\") == \"hello-big-world\"'",
        "variants": [
            (1, [
                call("bash", command="cat text.py"),
                call("file", command="str_replace", path="text.py", old_str="s.split()", new_str="s.lower().split()"),
                call("python", code="from text import slugify\nslugify('Hello Big World')"),
                call("finish"),
            ]),
            (1, [
                call("bash", command="cat text.py"),
                call("finish"),
            ]),
        ],
    },
]

# ---------------------------------------------------------------------------------------
# Graded examples: math (examples/math.jsonl), code (examples/code.jsonl) and SWE
# (examples/swe.jsonl) tasks for the same stand-in server. Each variant's final answer is
# recorded in the task's metadata (`answers`: response and whether it is right), which
# tests/math_grading.rs checks against the grader, so the demo's mixed rewards are the
# ones intended.

MATH_SYSTEM = "Solve the problem. Put the final answer in \\boxed{} or call finish with it."


def think(answer_text):
    return "<think>\nLet me work it out step by step.\n</think>\n\n" + answer_text


math_tasks = []  # (prompt, truth, [(weight, response, correct, via_finish)])


def add_math(prompt, truth, right, wrong, hedge=None):
    i = len(math_tasks)
    variants = [(3, right, True, i % 2 == 0), (2, wrong, False, i % 3 == 0)]
    if hedge:
        variants.append((1, hedge, False, False))
    math_tasks.append((f"Problem {i + 1}. {prompt}", truth, variants))


from fractions import Fraction

for a, b in [(6, 8), (10, 4), (2, 3), (14, 21), (9, 12), (5, 6), (18, 24), (7, 9), (20, 30), (11, 4)]:
    f = Fraction(a, b)
    truth = f"\\frac{{{f.numerator}}}{{{f.denominator}}}"
    right = [f"so the answer is $\\boxed{{\\dfrac{{{f.numerator}}}{{{f.denominator}}}}}$.",
             f"The answer is {f.numerator}/{f.denominator}.",
             f"Hence $\\boxed{{\\frac{{{2 * f.numerator}}}{{{2 * f.denominator}}}}}$"][len(math_tasks) % 3]
    wrong = f"\\boxed{{{round(float(f), 2)}}}" if f.denominator not in (1, 2, 4, 5, 10) else f"\\boxed{{\\frac{{{f.numerator + 1}}}{{{f.denominator}}}}}"
    add_math(f"Write {a}/{b} as a fraction in lowest terms.", truth, right, wrong)

for rows, per in [(12, 15), (48, 25), (125, 16), (37, 41), (250, 12), (64, 64), (19, 23), (305, 7), (88, 14), (1200, 3)]:
    n = rows * per
    shown = f"{n:,}"
    add_math(f"An orchard has {rows} rows of {per} trees. How many trees are there?", str(n),
             f"{rows} rows times {per} trees is {shown} trees.\n#### {shown}",
             f"{rows} plus {per} is {rows + per}.\n#### {rows + per}")

for r1, r2 in [(2, 3), (-1, 4), (5, -5), (1, 7), (-2, -6), (3, 3)]:
    b, c = -(r1 + r2), r1 * r2
    eq = f"x^2 {'+' if b >= 0 else '-'} {abs(b)}x {'+' if c >= 0 else '-'} {abs(c)} = 0"
    truth = str(r1) if r1 == r2 else f"{r1}, {r2}"
    right = f"The roots are $x = {r2}$ and $x = {r1}$, so \\boxed{{{r2}, {r1}}}." if r1 != r2 else f"\\boxed{{{r1}}}"
    add_math(f"Solve {eq}.", truth, right, f"\\boxed{{{r1}, {r2 + 1}}}",
             hedge=f"It is either \\boxed{{{r1}}} or \\boxed{{{r2 + 10}}}.")

for k, m, bound in [(2, 4, 6), (3, 1, 10), (5, -5, 20), (4, 8, 0), (7, 0, 21)]:
    x0 = Fraction(bound + m, k)
    xs = str(x0.numerator) if x0.denominator == 1 else f"\\frac{{{x0.numerator}}}{{{x0.denominator}}}"
    add_math(f"Solve {k}x - {m} > {bound} and give the solution set as an interval." if m >= 0 else f"Solve {k}x + {-m} > {bound} and give the solution set as an interval.",
             f"({xs}, \\infty)", f"\\boxed{{x > {xs}}}", f"\\boxed{{[{xs}, \\infty)}}")

for i, (q, letter, other) in enumerate([("Which is a prime? (A) 21 (B) 27 (C) 29 (D) 33", "C", "A"),
                                        ("Which is largest? (A) 0.3 (B) 1/3 (C) 0.33 (D) 3/10", "B", "C"),
                                        ("Which is even? (A) 7 (B) 11 (C) 15 (D) 18", "D", "B"),
                                        ("Which equals 2^5? (A) 32 (B) 25 (C) 10 (D) 64", "A", "D"),
                                        ("Which is a square? (A) 50 (B) 49 (C) 48 (D) 47", "B", "A"),
                                        ("Which is divisible by 9? (A) 81 (B) 82 (C) 83 (D) 84", "A", "C")]):
    add_math(q, letter, f"The answer is ({letter}).", f"\\boxed{{{other}}}")

for part, whole in [(20, 80), (15, 60), (9, 12), (45, 50)]:
    p = Fraction(100 * part, whole)
    add_math(f"What percent of {whole} is {part}?", f"{p}\\%", f"\\boxed{{{p}\\%}}", f"\\boxed{{{p + 5}\\%}}")

for mant, exp in [(6.02, 23), (3.0, 8), (1.6, -19)]:
    add_math(f"Write {mant} times ten to the power {exp} in scientific notation.", f"{mant} \\times 10^{{{exp}}}",
             f"The answer is {mant}e{exp}.", f"\\boxed{{{mant} \\times 10^{{{exp + 1}}}}}")

for num, den in [(1, 3), (2, 9), (5, 11)]:
    f = Fraction(num, den)
    digits = str(Fraction(num * 10 ** 6, den).__floor__()).rjust(6, "0")
    period = {3: 1, 9: 1, 11: 2}[den]
    add_math(f"Write {num}/{den} as a decimal.", f"\\frac{{{num}}}{{{den}}}",
             f"\\boxed{{0.\\overline{{{digits[:period]}}}}}", f"\\boxed{{0.{digits[:3]}}}")

for expr, expanded, right, wrong in [("(x+1)^2", "x^2+2x+1", "1 + 2x + x^2", "x^2 + 1"),
                                     ("(x-2)(x+3)", "x^2+x-6", "x^2 + x - 6", "x^2 - x - 6"),
                                     ("(2x+1)(x-1)", "2x^2-x-1", "2x^2 - x - 1", "2x^2 + x - 1")]:
    add_math(f"Expand {expr}.", expanded, f"\\boxed{{{right}}}", f"\\boxed{{{wrong}}}")

assert len(math_tasks) == 50, len(math_tasks)


def final_turns(response, via_finish):
    if via_finish:
        return [call("finish", answer=response)]
    return [think(response)]


math_rules = [
    {"match": prompt, "variants": [{"weight": w, "turns": final_turns(r, f)} for w, r, _, f in variants]}
    for prompt, truth, variants in math_tasks
]

# Code: write solution.py (or answer with a fenced block); stdin/stdout cases, or unit tests.
code_problems = [
    ("sum", "Read integers from stdin (one line) and print their sum.", "print(sum(map(int, input().split())))", "print(sum(map(int, input().split())) + 1)", [("1 2 3\n", "6\n"), ("-5 5\n", "0\n"), ("100\n", "100\n")]),
    ("max", "Read integers from stdin (one line) and print the largest.", "print(max(map(int, input().split())))", "print(sorted(map(int, input().split()))[0])", [("3 9 2\n", "9\n"), ("-1 -7\n", "-1\n")]),
    ("reverse", "Read a line and print it reversed.", "print(input()[::-1])", "print(input())", [("abc\n", "cba\n"), ("racecar\n", "racecar\n")]),
    ("vowels", "Read a line and print how many vowels (aeiou, any case) it has.", "print(sum(c in 'aeiouAEIOU' for c in input()))", "print(sum(c in 'aeiou' for c in input()))", [("Hello World\n", "3\n"), ("AEIOU\n", "5\n")]),
    ("factorial", "Read n and print n!.", "import math\nprint(math.factorial(int(input())))", "n = int(input())\nr = 1\nfor i in range(1, n):\n    r *= i\nprint(r)", [("5\n", "120\n"), ("0\n", "1\n"), ("10\n", "3628800\n")]),
    ("gcd", "Read two integers and print their greatest common divisor.", "import math\na, b = map(int, input().split())\nprint(math.gcd(a, b))", "a, b = map(int, input().split())\nprint(min(a, b))", [("12 18\n", "6\n"), ("7 13\n", "1\n")]),
    ("prime", "Read n and print yes if it is prime, else no.", "n = int(input())\nprint('yes' if n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1)) else 'no')", "n = int(input())\nprint('yes' if n % 2 else 'no')", [("7\n", "yes\n"), ("9\n", "no\n"), ("2\n", "yes\n")]),
    ("sort", "Read integers (one line) and print them sorted ascending, space-separated.", "print(*sorted(map(int, input().split())))", "print(*sorted(input().split()))", [("3 10 2\n", "2 3 10\n"), ("5 -1\n", "-1 5\n")]),
    ("words", "Read a line and print how many words it has.", "print(len(input().split()))", "print(input().count(' '))", [("a b  c\n", "3\n"), ("one\n", "1\n")]),
    ("fizz", "Read n and print FizzBuzz from 1 to n, one per line.", "for i in range(1, int(input()) + 1):\n    print('FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else i)", "for i in range(1, int(input()) + 1):\n    print('Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else i)", [("5\n", "1\n2\nFizz\n4\nBuzz\n"), ("15\n", "\n".join('FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else str(i) for i in range(1, 16)) + "\n")]),
    ("fib", "Read n and print the n-th Fibonacci number (F(0) = 0, F(1) = 1).", "a, b = 0, 1\nfor _ in range(int(input())):\n    a, b = b, a + b\nprint(a)", "def f(n):\n    return n if n < 2 else f(n - 1) + f(n - 2)\nprint(f(int(input())))", [("10\n", "55\n"), ("90\n", "2880067194370816120\n")]),
    ("count", "Read n and print the numbers 1 to n on one line.", "print(*range(1, int(input()) + 1))", "print(*range(1, int(input())))", [("3\n", "1 2 3\n"), ("1\n", "1\n")]),
    ("palin", "Read a line and print yes if it reads the same backwards, ignoring case, else no.", "s = input().lower()\nprint('yes' if s == s[::-1] else 'no')", "s = input()\nprint('yes' if s == s[::-1] else 'no')", [("Abba\n", "yes\n"), ("abc\n", "no\n")]),
    ("digits", "Read a non-negative integer and print the sum of its digits.", "print(sum(map(int, input().strip())))", "print(len(input().strip()))", [("1234\n", "10\n"), ("0\n", "0\n")]),
    ("square", "Read n and print n squared.", "n = int(input())\nprint(n * n)", "n = int(input())\nprint(n * 2)", [("2\n", "4\n"), ("9\n", "81\n")]),
    ("memory", "Read n and print the sum of 1..n.", "n = int(input())\nprint(n * (n + 1) // 2)", "n = int(input())\nprint(sum(list(range(n + 1)) * 50))", [("100\n", "5050\n"), ("30000000\n", "450000015000000\n")]),
]
unit_problems = [
    ("mean", "Write mean(xs) in stats.py returning the arithmetic mean.", "stats.py", "def mean(xs):\n    return sum(xs) / len(xs)\n", "def mean(xs):\n    return sum(xs) // len(xs)\n",
     {"test_stats.py": "from stats import mean\n\n\ndef test_ints():\n    assert mean([1, 2, 3]) == 2\n\n\ndef test_fraction():\n    assert mean([1, 2]) == 1.5\n"}),
    ("title", "Write title(s) in text.py capitalising every word.", "text.py", "def title(s):\n    return ' '.join(w.capitalize() for w in s.split(' '))\n", "def title(s):\n    return s.capitalize()\n",
     {"test_text.py": "from text import title\n\n\ndef test_one():\n    assert title('hello') == 'Hello'\n\n\ndef test_many():\n    assert title('hello big world') == 'Hello Big World'\n"}),
    ("chunks", "Write chunks(xs, n) in chunk.py splitting a list into lists of n.", "chunk.py", "def chunks(xs, n):\n    return [xs[i:i + n] for i in range(0, len(xs), n)]\n", "def chunks(xs, n):\n    return [xs[i:i + n] for i in range(0, len(xs) - n, n)]\n",
     {"test_chunk.py": "from chunk import chunks\n\n\ndef test_even():\n    assert chunks([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]\n\n\ndef test_rest():\n    assert chunks([1, 2, 3], 2) == [[1, 2], [3]]\n"}),
    ("clamp", "Write clamp(x, lo, hi) in clamp.py.", "clamp.py", "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n", "import sys\n\n\ndef clamp(x, lo, hi):\n    sys.exit(0)\n",
     {"test_clamp.py": "from clamp import clamp\n\n\ndef test_inside():\n    assert clamp(5, 0, 10) == 5\n\n\ndef test_high():\n    assert clamp(50, 0, 10) == 10\n"}),
]
CODE_SYSTEM = "You write small, correct Python programs. Save them in the workspace, then call finish."
code_tasks = []  # (prompt, grader, variants)
for i, (name, prompt, good, bad, cases) in enumerate(code_problems):
    p = f"Code task {i + 1} ({name}). {prompt}"
    grader = {"type": "code", "run": "python3 solution.py", "cases": [{"name": f"case {j}", "stdin": s, "stdout": o} for j, (s, o) in enumerate(cases)],
              "time_limit_ms": 2000, "memory_limit_mb": 256}
    if i % 4 == 3:
        grader["reward"] = "fraction"
    if i % 3 == 2:
        grader["program"] = {"path": "solution.py", "language": "python"}
        variants = [(2, [call("finish", answer=f"Here it is:\n```python\n{good}\n```")]),
                    (1, [call("finish", answer=f"```python\n{bad}\n```")])]
    else:
        variants = [(2, [call("file", command="create", path="solution.py", file_text=good + "\n"),
                         call("bash", command="echo 1 2 | python3 solution.py"), call("finish")]),
                    (1, [call("file", command="create", path="solution.py", file_text=bad + "\n"), call("finish")])]
    code_tasks.append((p, grader, variants))
for i, (name, prompt, path, good, bad, tests) in enumerate(unit_problems):
    p = f"Unit task {i + 1} ({name}). {prompt}"
    grader = {"type": "code", "tests": tests, "test_command": "python3 -m pytest -rA -p no:cacheprovider " + " ".join(tests),
              "test_timeout_ms": 60000, "reward": "fraction" if i % 2 else "all"}
    variants = [(2, [call("file", command="create", path=path, file_text=good), call("finish")]),
                (1, [call("file", command="create", path=path, file_text=bad), call("finish")])]
    code_tasks.append((p, grader, variants))
assert len(code_tasks) == 20, len(code_tasks)
code_rules = [{"match": p, "variants": [{"weight": w, "turns": t} for w, t in v]} for p, _, v in code_tasks]

# SWE: the five tiny repositories of examples/swe, cloned from .rollout/swe-repos (where
# scripts/demo.sh builds them; paths are relative to the directory the workers run in).
import importlib.util

_spec = importlib.util.spec_from_file_location("swe_examples", "scripts/make-swe-examples.py")
swe_examples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(swe_examples)
instances = [json.loads(l) for l in open("examples/swe/instances.jsonl") if l.strip()]
SWE_SYSTEM = "You are a software engineer fixing a bug in the repository in your workspace. Change the code, run the tests with python3 -m pytest, then call finish."
swe_rules, swe_tasks = [], []
for repo, inst in zip(swe_examples.REPOS, instances):
    prompt = f"Repository {repo['name']}: {repo['problem']}"
    edits = lambda files: [call("file", command="create", path=p, file_text=c) for p, c in files.items()]
    forged = {f: "def test_everything():\n    pass\n" for f in repo["tests"] if f in repo["base"]}
    swe_rules.append({"match": prompt, "variants": [
        {"weight": 2, "turns": [call("bash", command="git log --oneline | head -3 && ls"), *edits(repo["gold"]), call("bash", command="python3 -m pytest -q -p no:cacheprovider tests | tail -3"), call("finish", answer="fixed")]},
        {"weight": 1, "turns": [*edits(repo["wrong"]), call("finish", answer="fixed, I think")]},
        {"weight": 1, "turns": [*edits(repo["wrong"]), *edits(forged), call("bash", command="python3 -m pytest -q -p no:cacheprovider tests | tail -1"), call("finish", answer="tests pass")]},
    ]})
    swe_tasks.append((prompt, inst, repo["name"]))

rules_graded = math_rules + code_rules + swe_rules


def write_graded():
    with open("examples/math.jsonl", "w") as f:
        f.write("# Math episodes (kind `agent`, grader `math`) against the stand-in server: 50 problems,\n")
        f.write("# one sample each; the script answers right, wrong or hedged in many formats, and\n")
        f.write("# metadata.answers lists each scripted answer with its intended verdict.\n")
        f.write("# Written by scripts/make-agent-examples.py.\n")
        for i, (prompt, truth, variants) in enumerate(math_tasks):
            f.write(json.dumps({
                "kind": "agent", "group_id": f"math-{i}",
                "metadata": {"answers": [{"response": r, "correct": c} for _, r, c, _ in variants]},
                "spec": {"messages": [{"role": "system", "content": MATH_SYSTEM}, {"role": "user", "content": prompt}],
                         "grader": {"type": "math", "answer": truth}},
            }, ensure_ascii=False) + "\n")
    with open("examples/code.jsonl", "w") as f:
        f.write("# Code episodes (kind `agent`, grader `code`): 16 stdin/stdout problems (some taking the\n")
        f.write("# program from a fenced block of the answer, some rewarded by fraction) and 4 unit-test\n")
        f.write("# problems; the script writes a right or a wrong program. Written by scripts/make-agent-examples.py.\n")
        for i, (prompt, grader, _) in enumerate(code_tasks):
            for s in range(2):
                f.write(json.dumps({
                    "kind": "agent", "group_id": f"code-{i}",
                    "spec": {"messages": [{"role": "system", "content": CODE_SYSTEM}, {"role": "user", "content": prompt}],
                             "grader": grader},
                }, ensure_ascii=False) + "\n")
    with open("examples/swe.jsonl", "w") as f:
        f.write("# SWE episodes (kind `agent`, grader `swe`) on the five tiny repositories of examples/swe,\n")
        f.write("# cloned from .rollout/swe-repos (scripts/demo.sh builds them there; run from the\n")
        f.write("# repository root). The script sends the fix, a wrong fix, or a wrong fix with the\n")
        f.write("# tests rewritten to pass (scored 0: the tests are put back). Written by scripts/make-agent-examples.py.\n")
        for prompt, inst, name in swe_tasks:
            for s in range(4):
                f.write(json.dumps({
                    "kind": "agent", "group_id": f"swe-{name}",
                    "spec": {"messages": [{"role": "system", "content": SWE_SYSTEM}, {"role": "user", "content": prompt}],
                             "limits": {"max_turns": 10},
                             "grader": {"type": "swe", "instance": inst, "repo_url": f".rollout/swe-repos/{name}", "timeout_ms": 120000}},
                }, ensure_ascii=False) + "\n")

policy = {
    "assistant_marker": "<|im_start|>assistant",
    "rules": [
        {"match": t["prompt"], "variants": [{"weight": w, "turns": turns} for w, turns in t["variants"]]}
        for t in tasks
    ] + rules_graded,
    "fallback": [{"turns": ["I cannot help with that."]}],
}
with open("examples/agent-policy.json", "w") as f:
    json.dump(policy, f, indent=2, ensure_ascii=False)
    f.write("\n")

with open("examples/agent.jsonl", "w") as f:
    f.write("# Agent episodes (kind `agent`) against the stand-in inference server, which plays the\n")
    f.write("# script in examples/agent-policy.json (it is not a model): 4 prompts, 8 samples each.\n")
    f.write("# Written by scripts/make-agent-examples.py. See src/kinds/agent.rs for the format.\n")
    for i, t in enumerate(tasks):
        for s in range(8):
            task = {
                "kind": "agent",
                "group_id": f"agent-{i}",
                "spec": {
                    "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": t["prompt"]}],
                    "sandbox": {"files": t["files"]},
                    "check": {"command": t["check"]},
                },
            }
            f.write(json.dumps(task, ensure_ascii=False) + "\n")

write_graded()
