"""Tests of the trainer adapters (rollout_client.adapters): each runs episodes on a real
`rollout up` with the stand-in inference server and is checked against the trajectories
the service returned.

How each is checked against its trainer (the README's "Adapters" section):
- SkyRL: the real `GeneratorInterface` and `GeneratorOutput` of skyrl-train 0.3.1,
  installed by scripts/trainer-adapters-env.sh into ROLLOUT_TRAINER_SITE;
- verl and slime: their modules import torch (and verl's ray), so the adapters' output
  is checked against the fields of the pinned versions, listed below with the file
  they were read from.
"""

import asyncio
import dataclasses
import enum
import json
import os
import sys
import time
import types
import unittest
from pathlib import Path

from rollout_client import RolloutTimeout
from rollout_client.adapters import (
    Episodes,
    EpisodeFailed,
    default_task,
    turn_versions,
    with_trainer_sampling,
)
from rollout_client.adapters import skyrl as skyrl_adapter
from rollout_client.adapters import slime as slime_adapter
from rollout_client.adapters import verl as verl_adapter
from rollout_client.local import LocalService
from rollout_client.types import JobResult

ROOT = Path(__file__).resolve().parents[3]

# verl 0.9.1, verl/experimental/agent_loop/agent_loop.py: the fields of AgentLoopOutput
# (a pydantic model; the first four have no default) and of AgentLoopMetrics.
VERL_OUTPUT_FIELDS = {
    "prompt_ids", "response_ids", "response_mask", "metrics", "response_logprobs",
    "routed_experts", "multi_modal_data", "reward_score", "num_turns", "extra_fields",
    "mm_processor_kwargs", "mm_processor_output",
}
VERL_OUTPUT_REQUIRED = {"prompt_ids", "response_ids", "response_mask", "metrics"}
VERL_METRICS_FIELDS = {"generate_sequences", "tool_calls", "compute_score", "num_preempted"}

# slime v0.3.1, slime/utils/types.py: the dataclass Sample's fields with their defaults,
# and its Status enum. The stand-in below has exactly these (and slots, so setting any
# other attribute fails).
SLIME_SAMPLE_FIELDS = [
    ("group_index", None), ("index", None), ("rollout_id", None), ("prompt", ""),
    ("tokens", list), ("multimodal_inputs", None), ("multimodal_train_inputs", None),
    ("multimodal_train_input_id", None), ("apply_chat_template_kwargs", dict),
    ("response", ""), ("response_length", 0), ("label", None), ("reward", None),
    ("loss_mask", None), ("weight_versions", list), ("rollout_log_probs", None),
    ("rollout_top_p_token_ids", None), ("rollout_top_p_token_offsets", None),
    ("rollout_routed_experts", None), ("remove_sample", False), ("teacher_log_probs", None),
    ("status", "PENDING"), ("metadata", dict), ("generate_function_path", None),
    ("custom_rm_path", None), ("train_metadata", None), ("session_id", None),
    ("non_generation_time", 0.0), ("spec_info", None), ("prefix_cache_info", None),
]
SLIME_STATUSES = {"PENDING": "pending", "COMPLETED": "completed", "TRUNCATED": "truncated",
                  "ABORTED": "aborted", "FAILED": "failed"}


def slime_sample_class():
    """A stand-in for slime's Sample with v0.3.1's fields and statuses, and nothing else."""
    status = enum.Enum("Status", SLIME_STATUSES)
    fields = []
    for name, default in SLIME_SAMPLE_FIELDS:
        if default is list or default is dict:
            fields.append((name, object, dataclasses.field(default_factory=default)))
        elif name == "status":
            fields.append((name, object, dataclasses.field(default=status.PENDING)))
        else:
            fields.append((name, object, dataclasses.field(default=default)))
    return dataclasses.make_dataclass("Sample", fields, namespace={"Status": status}, slots=True)


Sample = slime_sample_class()


def missing(test: unittest.TestCase, why: str) -> None:
    """A prerequisite is missing: under CI=true the test fails with the reason; elsewhere
    it is skipped, and the skip is listed at the end of the test command."""
    if os.environ.get("CI") in ("true", "1"):
        test.fail(f"cannot run under CI: {why}")
    skips = os.environ.get("ROLLOUT_TEST_SKIPS")
    if skips:
        with open(skips, "a") as f:
            f.write(f"SKIPPED {test.id()}: {why}\n")
    test.skipTest(why)


def example_tasks():
    """The example agent tasks, one per prompt."""
    tasks = {}
    for line in (ROOT / "examples" / "agent.jsonl").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            task = json.loads(line)
            tasks.setdefault(task.pop("group_id"), task)
    return list(tasks.values())


STATS, SQUARES, HELLO, SLUG = example_tasks()
MATH_MESSAGES = [
    {"role": "system",
     "content": "Solve the problem. Put the final answer in \\boxed{} or call finish with it."},
    {"role": "user", "content": "Problem 1. Write 6/8 as a fraction in lowest terms."},
]


def limited(task, **limits):
    task = json.loads(json.dumps(task))
    task["spec"].setdefault("limits", {}).update(limits)
    return task


def math_reward(traj) -> float:
    """What the math grader must give the stand-in's answer to problem 1 (3/4): it
    answers right (`\\dfrac{3}{4}`) or wrong (`\\frac{4}{4}`)."""
    return 1.0 if "dfrac{3}{4}" in traj.turns[-1]["text"] else 0.0


svc: LocalService


class Live(unittest.TestCase):
    """Tests against the module's one service, started by the first of them (the
    binaries are taken from ROLLOUT_BIN_DIR, default target/debug)."""

    @classmethod
    def setUpClass(cls):
        global svc
        if "svc" not in globals():
            bin_dir = os.environ.get("ROLLOUT_BIN_DIR", str(ROOT / "target" / "debug"))
            service = LocalService(bin_dir, str(ROOT / "examples" / "agent-policy.json"))
            service.__enter__()
            svc = service


def tearDownModule():
    if "svc" in globals():
        svc.stop()


class TaskMapping(unittest.TestCase):
    def test_a_rows_task_comes_from_its_fields_its_extra_info_or_its_json_text(self):
        task = {"kind": "agent", "spec": {"messages": [{"role": "user", "content": "x"}],
                                         "check": {"command": "true"}}}
        self.assertEqual(default_task(None, {"task": task}), task)
        self.assertEqual(default_task(None, {"extra_info": {"task": json.dumps(task)}}), task)
        # A task in the row wins over the row's prompt and ground truth.
        prompt = [{"role": "user", "content": "y"}]
        self.assertEqual(default_task(prompt, {"task": task}, "7"), task)

    def test_messages_with_a_ground_truth_become_a_math_graded_episode(self):
        class Array:  # what a parquet row holds: a numpy array, which answers tolist()
            def __init__(self, items):
                self.items = items

            def tolist(self):
                return list(self.items)

        row = {"raw_prompt": Array(MATH_MESSAGES), "reward_model": {"ground_truth": "\\frac{3}{4}"}}
        self.assertEqual(verl_adapter.row_task(row), {
            "kind": "agent",
            "spec": {"messages": MATH_MESSAGES,
                     "grader": {"type": "math", "answer": "\\frac{3}{4}"}},
        })
        with self.assertRaisesRegex(ValueError, "task function"):
            default_task(MATH_MESSAGES, {})
        with self.assertRaisesRegex(ValueError, "task function"):
            default_task("<|im_start|>user\nrendered text", {}, "3")

    def test_the_trainers_sampling_fills_only_what_the_task_leaves_open(self):
        task = {"kind": "agent", "spec": {"messages": [], "sampling": {"temperature": 0.6},
                                         "limits": {"max_turns": 3}}}
        out = with_trainer_sampling(task, {"temperature": 1.0, "top_p": 0.9, "top_k": -1,
                                           "logprobs": True}, max_tokens=4096)
        self.assertEqual(out["spec"]["sampling"], {"temperature": 0.6, "top_p": 0.9, "top_k": -1})
        self.assertEqual(out["spec"]["limits"], {"max_turns": 3, "max_tokens": 4096})
        self.assertEqual(task["spec"]["sampling"], {"temperature": 0.6}, "the task is a copy")
        synthetic = {"kind": "synthetic", "spec": {"run_ms": 1}}
        self.assertEqual(with_trainer_sampling(synthetic, {"temperature": 1.0}, max_tokens=9),
                         synthetic)


def result(status="done", reward=1.0, run=None, job_id="j1"):
    return JobResult({"job_id": job_id, "status": status, "reward": reward,
                      "error": None if status == "done" else "backend down",
                      "output": {"run": run} if run is not None else {}})


def trajectory(prompt, response, mask, finish="finished", turns=None, **more):
    return {"prompt_ids": prompt, "response_ids": response, "loss_mask": mask,
            "logprobs": [-0.5 if m else 0.0 for m in mask], "finish_reason": finish,
            "turns": turns or [{"text": "t", "model_range": [0, len(response)],
                                "observation_range": [len(response), len(response)]}],
            **more}


class Conversions(unittest.TestCase):
    """What the service's results become, on results made here: cases a live run
    cannot be steered into (failed jobs, several samples, a turn cut by an update)."""

    def test_versions_are_read_per_generation_from_the_spans(self):
        traj = JobResult({"output": {"run": trajectory(
            [1], list(range(10)), [1, 1, 1, 0, 0, 1, 1, 1, 1, 1],
            turns=[{"model_range": [0, 3], "observation_range": [3, 5]},
                   {"model_range": [5, 10], "observation_range": [10, 10]}],
            policy_versions=[{"version": 4, "from": 0, "to": 7},
                             {"version": 5, "from": 7, "to": 10}])}}).trajectory
        # The second turn straddled the update to 5: two generations, as slime counts them.
        self.assertEqual(turn_versions(traj), [4, 4, 5])

    def test_an_agent_programs_samples_fan_out_into_slime_samples_of_one_rollout(self):
        first = trajectory([1, 2], [3, 4], [1, 1])
        last = trajectory([1, 2, 3, 4, 9], [5, 6, 7], [1, 0, 1], finish="exited")
        run = dict(last, samples=[first, last])
        sample = Sample(index=7, prompt="p", metadata={"keep": 1})
        out = slime_adapter.fill_sample(sample, result(reward=0.5, run=run))
        self.assertEqual(len(out), 2)
        self.assertEqual([s.tokens for s in out], [[1, 2, 3, 4], [1, 2, 3, 4, 9, 5, 6, 7]])
        self.assertEqual([s.response_length for s in out], [2, 3])
        self.assertEqual([s.loss_mask for s in out], [[1, 1], [1, 0, 1]])
        self.assertEqual([s.rollout_id for s in out], [7, 7])
        self.assertEqual([s.reward for s in out], [0.5, 0.5])
        self.assertEqual({s.status for s in out}, {Sample.Status.COMPLETED})
        self.assertIsNot(out[0].metadata, out[1].metadata)
        self.assertEqual(out[1].metadata["keep"], 1)

    def test_a_job_without_a_score_is_no_training_sample(self):
        for status, expected in (("cancelled", "ABORTED"), ("stale", "ABORTED"),
                                 ("failed", "FAILED"), ("timed_out", "FAILED")):
            partial = trajectory([1], [2, 3], [1, 0], finish=None)
            sample = slime_adapter.fill_sample(Sample(), result(status, None, partial))
            self.assertEqual(sample.status, Sample.Status[expected], status)
            self.assertEqual((sample.reward, sample.remove_sample), (0.0, True))
            self.assertEqual((sample.tokens, sample.loss_mask), ([1, 2, 3], [1, 0]))
            self.assertEqual(sample.metadata["rollout"]["error"], "backend down")
            # verl and SkyRL have no such status: a batch cannot hold a hole.
            with self.assertRaises(EpisodeFailed):
                verl_adapter.agent_loop_output(result(status, None, partial), 8)
        sample = slime_adapter.fill_sample(Sample(), result("failed", None))
        self.assertEqual((sample.status, sample.tokens), (Sample.Status.FAILED, []))


class Verl(Live):
    def run_rows(self, rows, response_length=4096, prompt_length=4096, sampling=None):
        episodes = Episodes(svc.client(), timeout=120)

        async def go():
            return await asyncio.gather(*(
                verl_adapter.run_episode(episodes, verl_adapter.row_task, row,
                                         sampling or {"temperature": 1.0}, prompt_length,
                                         response_length)
                for row in rows))

        return asyncio.run(go())

    def job_of(self, fields):
        return svc.client().job(fields["extra_fields"]["rollout_job_id"])

    def check_fields(self, fields):
        self.assertLessEqual(set(fields), VERL_OUTPUT_FIELDS)
        self.assertLessEqual(VERL_OUTPUT_REQUIRED, set(fields))
        self.assertLessEqual(set(fields["metrics"]), VERL_METRICS_FIELDS)
        tokens = fields["prompt_ids"] + fields["response_ids"]
        self.assertTrue(all(isinstance(t, int) for t in tokens))
        self.assertIsInstance(fields["reward_score"], float)

    def test_each_row_becomes_the_episodes_tokens_mask_logprobs_and_reward(self):
        rows = [
            {"raw_prompt": STATS["spec"]["messages"], "extra_info": {"task": STATS}, "uid": "u0"},
            {"raw_prompt": SQUARES["spec"]["messages"], "extra_info": {"task": json.dumps(SQUARES)},
             "uid": "u1"},
            {"raw_prompt": HELLO["spec"]["messages"], "task": HELLO, "uid": "u2"},
            # verl's GSM8K/MATH row shape: no task, graded by the service's math grader.
            {"raw_prompt": MATH_MESSAGES, "reward_model": {"ground_truth": "\\frac{3}{4}"},
             "uid": "u3"},
        ]
        outputs = self.run_rows(rows, sampling={"temperature": 0.7, "top_p": 0.95, "top_k": -1})
        for row, fields in zip(rows, outputs):
            self.check_fields(fields)
            view = self.job_of(fields)
            traj = view.result.trajectory
            self.assertEqual(fields["prompt_ids"], traj.prompt_ids)
            self.assertEqual(fields["response_ids"], traj.response_ids)
            self.assertEqual(fields["response_mask"], traj.loss_mask)
            self.assertEqual(fields["response_logprobs"], traj.logprobs)
            self.assertEqual(fields["reward_score"], view.result.reward)
            observations = sum(t["observation_range"][1] > t["observation_range"][0]
                               for t in traj.turns)
            self.assertEqual(fields["num_turns"], 1 + len(traj.turns) + observations)
            self.assertEqual(fields["extra_fields"]["rollout_finish_reason"], traj.finish_reason)
            self.assertEqual(fields["extra_fields"]["rollout_dropped_tokens"], 0)
            # The task as sent: the row's, with verl's sampling and context as defaults.
            task = view.job.task
            self.assertEqual(task["group_id"], row["uid"])
            self.assertEqual(task["spec"]["sampling"],
                             {"temperature": 0.7, "top_p": 0.95, "top_k": -1})
            self.assertEqual(task["spec"]["limits"]["max_tokens"], 8192)
        squares = outputs[1]
        self.assertIn(0, squares["response_mask"], "a tool call, then its observation")
        self.assertEqual(squares["num_turns"], 4, "the prompt, a tool call, its result, finish")
        math_task = self.job_of(outputs[3]).job.task
        self.assertEqual(math_task["spec"]["grader"], {"type": "math", "answer": "\\frac{3}{4}"})
        self.assertEqual(outputs[3]["reward_score"],
                         math_reward(self.job_of(outputs[3]).result.trajectory))

    def test_a_response_longer_than_response_length_is_cut_with_its_mask_and_logprobs(self):
        # Every squares episode is a tool call, its observation and a call of finish.
        (fields,) = self.run_rows([{"raw_prompt": [], "task": SQUARES}], response_length=24)
        traj = self.job_of(fields).result.trajectory
        self.assertGreater(len(traj.response_ids), 24)
        self.assertEqual(fields["response_ids"], traj.response_ids[:24])
        self.assertEqual(fields["response_mask"], traj.loss_mask[:24])
        self.assertEqual(fields["response_logprobs"], traj.logprobs[:24])
        self.assertEqual(fields["extra_fields"]["rollout_dropped_tokens"],
                         len(traj.response_ids) - 24)
        self.assertEqual(fields["reward_score"], self.job_of(fields).result.reward)
        # A cut inside the first observation keeps the model's tokens (mask 1, their
        # logprobs) and the observation's first two (mask 0, logprob 0).
        start, _ = traj.turns[0]["observation_range"]
        with self.assertLogs("rollout_client.adapters.verl", "WARNING") as logs:
            cut = verl_adapter.agent_loop_output(self.job_of(fields).result, start + 2,
                                                 prompt_length=5)
        self.assertIn(f"prompt of {len(traj.prompt_ids)} tokens exceeds", logs.output[0])
        self.assertEqual(cut["response_mask"], [1] * start + [0, 0])
        self.assertEqual(cut["response_logprobs"], traj.logprobs[:start] + [0.0, 0.0])
        self.assertTrue(all(lp < 0 for lp in traj.logprobs[:start]), "the model's logprobs")
        self.assertEqual(cut["response_ids"], traj.response_ids[:start + 2])
        # A prompt over prompt_length keeps its end, as verl's own loops do.
        self.assertEqual(cut["prompt_ids"], traj.prompt_ids[-5:])


class Slime(Live):
    def generate(self, samples, **args):
        args = types.SimpleNamespace(rollout_gateway=svc.url, rollout_timeout=120, **args)
        sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 1024}

        async def go():
            return await asyncio.gather(
                *(slime_adapter.generate(args, s, sampling) for s in samples))

        return asyncio.run(go())

    def test_samples_get_the_episodes_tokens_reward_status_and_versions(self):
        client = svc.client()
        version = (client.policy().get("current") or {}).get("version", 0) + 3
        client.announce_policy(version)
        samples = [
            Sample(group_index=0, index=0, prompt=STATS["spec"]["messages"],
                   metadata={"task": STATS}),
            Sample(group_index=1, index=1, prompt=HELLO["spec"]["messages"],
                   metadata={"task": limited(HELLO, max_turns=1)}),
            Sample(group_index=2, index=2, prompt=MATH_MESSAGES, label="\\frac{3}{4}"),
        ]
        out = self.generate(samples, rollout_max_context_len=6000)
        for sample, filled in zip(samples, out):
            self.assertIs(filled, sample, "one episode, one sample: filled in place")
            view = client.job(sample.metadata["rollout"]["job_id"])
            traj = view.result.trajectory
            # slime's own invariants (types.py's _validate_response_metadata_lengths).
            self.assertEqual(len(sample.loss_mask), sample.response_length)
            self.assertEqual(len(sample.rollout_log_probs), sample.response_length)
            self.assertEqual(sample.tokens, traj.prompt_ids + traj.response_ids)
            self.assertEqual(sample.response_length, len(traj.response_ids))
            self.assertEqual(sample.loss_mask, traj.loss_mask)
            self.assertEqual(sample.rollout_log_probs, traj.logprobs)
            self.assertEqual(sample.reward, view.result.reward)
            self.assertEqual(sample.response, "".join(t["text"] for t in traj.turns))
            self.assertEqual(sample.weight_versions, [str(version)] * len(traj.turns))
            self.assertFalse(sample.remove_sample)
            self.assertEqual(view.job.task["group_id"], f"slime-{sample.group_index}")
            self.assertEqual(view.job.task["spec"]["limits"]["max_tokens"], 6000)
        stats, hello, math = samples
        self.assertEqual(stats.status, Sample.Status.COMPLETED)
        self.assertEqual(hello.metadata["rollout"]["finish_reason"], "max_turns")
        self.assertEqual(hello.status, Sample.Status.TRUNCATED)
        self.assertEqual(math.status, Sample.Status.COMPLETED)
        self.assertEqual(math.reward, math_reward(client.job(math.metadata["rollout"]["job_id"])
                                                  .result.trajectory))


class SkyRL(Live):
    def generator_class(self):
        """The adapter's generator, built on skyrl-train 0.3.1's real GeneratorInterface.
        The package's __init__ files import its gym generator, hence torch and ray; the
        generators package is registered without running its __init__, so that the
        real base.py is imported by the ordinary machinery."""
        site = os.environ.get("ROLLOUT_TRAINER_SITE")
        if not site or not (Path(site) / "skyrl_train").is_dir():
            missing(self, "ROLLOUT_TRAINER_SITE does not hold skyrl-train: run "
                          "`export ROLLOUT_TRAINER_SITE=$(scripts/trainer-adapters-env.sh)` "
                          "first (the test command does)")
        if site not in sys.path:
            sys.path.insert(0, site)
        if "skyrl_train.generators" not in sys.modules:
            package = types.ModuleType("skyrl_train.generators")
            package.__path__ = [str(Path(site) / "skyrl_train" / "generators")]
            sys.modules["skyrl_train.generators"] = package
        from skyrl_train.generators.base import GeneratorInterface, GeneratorOutput, TrajectoryID

        from rollout_client.adapters.skyrl import RolloutServiceGenerator

        self.assertTrue(issubclass(RolloutServiceGenerator, GeneratorInterface))
        return RolloutServiceGenerator, GeneratorOutput, TrajectoryID

    def test_a_batch_comes_back_in_input_order_with_skyrls_fields(self):
        Generator, GeneratorOutput, TrajectoryID = self.generator_class()
        # The first prompt's sandbox takes seconds to set up: it ends last.
        slow = json.loads(json.dumps(SLUG))
        slow["spec"]["sandbox"]["setup"] = ["sleep 3"]
        rows = [
            ([{"role": "user", "content": "slug"}], {"task": slow}),
            (HELLO["spec"]["messages"], {"task": limited(HELLO, max_turns=1)}),
            (MATH_MESSAGES, {"reward_spec": {"method": "rule", "ground_truth": "\\frac{3}{4}"}}),
            (SQUARES["spec"]["messages"], {"extra_info": {"task": SQUARES}}),
        ]

        def numbered(prompt, env_extras):
            """The default task, numbered, to find each row's job among the results."""
            task = skyrl_adapter.extras_task(prompt, env_extras)
            task["metadata"] = {"row": env_extras["row"]}
            return task

        generator = Generator(gateway=svc.url, task_fn=numbered, timeout=180)
        client = svc.client()
        before = client.results(after=0, limit=1000).next_cursor
        batch = {
            "prompts": [p for p, _ in rows],
            "env_classes": ["rollout"] * len(rows),
            "env_extras": [dict(e, row=i) for i, (_, e) in enumerate(rows)],
            "sampling_params": {"temperature": 0.8, "top_p": 1.0, "max_tokens": 512, "logprobs": 0},
            "trajectory_ids": [TrajectoryID(instance_id=f"p{i}", repetition_id=0)
                               for i in range(len(rows))],
            "batch_metadata": None,
        }
        started = time.monotonic()
        out = asyncio.run(generator.generate(batch))
        self.assertLess(time.monotonic() - started, 170)
        self.assertLessEqual(set(GeneratorOutput.__annotations__), set(out))
        by_row = {}
        for r in client.results(after=before, limit=1000).results:
            if r.batch_id.startswith("skyrl-"):
                by_row[r.metadata["row"]] = r
        self.assertEqual(sorted(by_row), [0, 1, 2, 3])
        self.assertEqual(max(by_row, key=lambda i: by_row[i].seq), 0,
                         "the slow first prompt ended last, yet comes first")
        for key in ("prompt_token_ids", "response_ids", "rewards", "loss_masks", "stop_reasons",
                    "rollout_logprobs"):
            self.assertEqual(len(out[key]), len(rows), key)
        for i in range(len(rows)):
            r = by_row[i]
            traj = r.trajectory
            self.assertEqual(out["prompt_token_ids"][i], traj.prompt_ids)
            self.assertEqual(out["response_ids"][i], traj.response_ids)
            self.assertEqual(out["loss_masks"][i], traj.loss_mask)
            self.assertEqual(out["rollout_logprobs"][i], traj.logprobs)
            self.assertEqual(out["rewards"][i], r.reward)
            # SkyRL's validate_generator_output (skyrl_train/utils/trainer_utils.py).
            self.assertEqual(len(out["loss_masks"][i]), len(out["response_ids"][i]))
            self.assertEqual(len(out["rollout_logprobs"][i]), len(out["response_ids"][i]))
            task = client.job(r.job_id).job.task
            self.assertEqual(task["group_id"], f"p{i}")
            self.assertEqual(task["spec"]["sampling"], {"temperature": 0.8, "top_p": 1.0})
        self.assertEqual(by_row[1].trajectory.finish_reason, "max_turns")
        self.assertEqual(out["stop_reasons"][1], "length")
        self.assertEqual([out["stop_reasons"][i] for i in (0, 2, 3)], ["stop"] * 3)
        self.assertEqual(out["rewards"][2], math_reward(by_row[2].trajectory))
        self.assertEqual(out["rewards"][3], by_row[3].reward)
        self.assertIn(0, out["loss_masks"][0], "the slug episode has tool observations")


class EpisodesWaits(Live):
    def test_an_episode_past_its_timeout_is_cancelled_on_the_service(self):
        client = svc.client()
        episodes = Episodes(client, timeout=0.5)
        with self.assertRaises(RolloutTimeout):
            asyncio.run(episodes.run({"kind": "synthetic", "spec": {"run_ms": 60000}}))
        (r,) = client.stream_results(episodes.batch_id, count=1, timeout=60)
        self.assertEqual(r.status, "cancelled")

    def test_many_episodes_share_one_result_stream_and_each_gets_its_own(self):
        episodes = Episodes(svc.client(), timeout=60)
        rewards = [i / 20 for i in range(20)]

        async def go():
            # Later tasks end first; each call still gets its own task's result.
            return await asyncio.gather(*(
                episodes.run({"kind": "synthetic", "spec": {"run_ms": 400 - 20 * i, "reward": r}})
                for i, r in enumerate(rewards)))

        results = asyncio.run(go())
        self.assertEqual([r.reward for r in results], rewards)
        self.assertEqual(len({r.job_id for r in results}), 20)
        self.assertEqual({r.batch_id for r in results}, {episodes.batch_id})


if __name__ == "__main__":
    unittest.main()
