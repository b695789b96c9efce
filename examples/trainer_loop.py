#!/usr/bin/env python3
"""An RL trainer's loop against the rollout service, without the model update: each step
asks for K informative groups of G samples (DAPO dynamic sampling), reads them as they
are accepted, turns them into the padded tensors a GRPO/DAPO step consumes, and prints
what it got and how long it took. The service launches new prompts as groups end and
cancels what is not needed once it has K.

With --gateway it talks to a running service; without, it starts one on this machine
(the stand-in inference server playing examples/agent-policy.json, which is not a model,
and `rollout up`) from the binaries in --bin-dir.

    cargo build --release --bins && python3 examples/trainer_loop.py --steps 3
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "clients" / "python"))

from rollout_client import RolloutClient, to_tensors  # noqa: E402
from rollout_client.local import LocalService  # noqa: E402


def prompts():
    out = []
    for line in (ROOT / "examples" / "agent.jsonl").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            task = json.loads(line)
            task.pop("group_id", None)
            task.pop("client_id", None)
            out.append(task)
    return out


def run(client: RolloutClient, steps: int, group_size: int, target: int) -> None:
    pool = prompts()
    for step in range(steps):
        started = time.monotonic()
        batch_id = f"step-{step}-{int(time.time())}"
        client.submit_batch(pool, group_size=group_size, target_groups=target,
                            max_groups_in_flight=target + 1, policy_version=step,
                            batch_id=batch_id)
        groups = []
        for g in client.groups(batch_id):
            groups.append(g)
            rewards = [r["reward"] for r in g["results"]]
            print(f"  step {step}: group {g['rank']} ({g['group_id']}) accepted after "
                  f"{time.monotonic() - started:.2f}s, rewards {rewards}")
        final = client.batch(batch_id)["batch"]
        c = final["counters"]
        tensors = to_tensors(groups) if groups else {"responses": []}
        width = len(tensors["responses"][0]) if tensors["responses"] else 0
        mean = (sum(tensors["rewards"]) / len(tensors["rewards"])) if groups else 0.0
        print(f"step {step}: {final['status']} in {time.monotonic() - started:.2f}s; "
              f"{len(groups)} accepted of {c['groups_launched']} launched "
              f"({c['uniform']} uniform, {c['incomplete']} incomplete, "
              f"{c['cancelled_groups']} cancelled); {c['jobs_saved']} jobs saved; "
              f"tensors {len(tensors['responses'])}x{width}, mean reward {mean:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gateway", help="URL of a running gateway (default: start one)")
    ap.add_argument("--bin-dir", default=str(ROOT / "target" / "release"))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--target-groups", type=int, default=2)
    args = ap.parse_args()
    if args.gateway:
        run(RolloutClient(args.gateway), args.steps, args.group_size, args.target_groups)
        return
    with LocalService(args.bin_dir, str(ROOT / "examples" / "agent-policy.json")) as svc:
        run(svc.client(), args.steps, args.group_size, args.target_groups)


if __name__ == "__main__":
    main()
