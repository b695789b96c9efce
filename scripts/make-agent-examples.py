#!/usr/bin/env python3
"""Writes examples/agent.jsonl (agent tasks) and examples/agent-policy.json (the script the
stand-in inference server plays for them). Tool calls are written exactly as a chat
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

policy = {
    "assistant_marker": "<|im_start|>assistant",
    "rules": [
        {"match": t["prompt"], "variants": [{"weight": w, "turns": turns} for w, turns in t["variants"]]}
        for t in tasks
    ],
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
