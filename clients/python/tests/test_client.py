"""Tests of the trainer client: SSE parsing and tensor conversion on their own, then the
whole client against a real `rollout up` with the stand-in inference server (the
binaries are taken from ROLLOUT_BIN_DIR, default target/debug)."""

import asyncio
import json
import os
import threading
import time
import unittest
import urllib.request
from pathlib import Path

from rollout_client import (
    AsyncRolloutClient,
    RolloutClient,
    RolloutConnectionError,
    RolloutError,
    RolloutTimeout,
    parse_sse,
    to_tensors,
)
from rollout_client.local import LocalService

ROOT = Path(__file__).resolve().parents[3]


def agent_prompts():
    """The example agent prompts (the stand-in plays a weighted script for each, so the
    samples of one prompt differ), without their group ids: a batch gives its own."""
    prompts = []
    for line in (ROOT / "examples" / "agent.jsonl").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            task = json.loads(line)
            task.pop("group_id", None)
            task.pop("client_id", None)
            prompts.append(task)
    return prompts


def group(rank, rewards, prompt_lens, response_lens):
    results = []
    for i, (reward, p, r) in enumerate(zip(rewards, prompt_lens, response_lens)):
        results.append({
            "job_id": f"j{rank}-{i}",
            "reward": reward,
            "output": {"run": {
                "prompt_ids": list(range(1, p + 1)),
                "response_ids": list(range(100, 100 + r)),
                "loss_mask": [1, 0] * (r // 2) + [1] * (r % 2),
                "logprobs": [-0.5] * r,
            }},
        })
    return {"batch_id": "b", "group_id": f"p{rank}", "rank": rank, "results": results}


class Offline(unittest.TestCase):
    def test_sse_events_are_parsed_across_comments_and_multiline_data(self):
        stream = [b": keep-alive\n", b"event: group\n", b"id: 3\n", b"data: {\"a\":\n",
                  b"data: 1}\n", b"\n", b"event: end\n", b"data: {}\n", b"\n"]
        events = list(parse_sse(stream))
        self.assertEqual(events, [("group", "{\"a\":\n1}", "3"), ("end", "{}", "3")])

    def test_tensors_are_padded_and_aligned_as_verl_names_them(self):
        t = to_tensors([group(1, [1.0, 0.0], [3, 2], [4, 1])], pad_token_id=0)
        self.assertEqual(t["prompts"], [[1, 2, 3], [0, 1, 2]])
        self.assertEqual(t["responses"], [[100, 101, 102, 103], [100, 0, 0, 0]])
        self.assertEqual(t["response_mask"], [[1, 0, 1, 0], [1, 0, 0, 0]])
        self.assertEqual(t["attention_mask"][1], [0, 1, 1, 1, 0, 0, 0])
        self.assertEqual(t["position_ids"][1], [0, 0, 1, 2, 0, 0, 0])
        self.assertEqual(t["input_ids"][1], [0, 1, 2, 100, 0, 0, 0])
        self.assertEqual(t["rollout_log_probs"][1], [-0.5, 0.0, 0.0, 0.0])
        self.assertEqual(t["token_level_scores"], [[0, 0, 0, 1.0], [0.0, 0, 0, 0]])
        self.assertEqual(t["rewards"], [1.0, 0.0])
        self.assertEqual(t["uid"], ["b:p1", "b:p1"])

    def test_the_token_and_the_url_come_from_the_environment(self):
        saved = {k: os.environ.get(k) for k in ("ROLLOUT_GATEWAY", "ROLLOUT_GATEWAY_TOKEN")}
        try:
            os.environ["ROLLOUT_GATEWAY"] = "http://gw.example:9000/"
            os.environ["ROLLOUT_GATEWAY_TOKEN"] = "s3cret"
            c = RolloutClient()
            self.assertEqual(c.url, "http://gw.example:9000")
            self.assertEqual(c._headers()["Authorization"], "Bearer s3cret")
            self.assertNotIn("Authorization", RolloutClient("http://x", token="")._headers())
            del os.environ["ROLLOUT_GATEWAY"]
            self.assertEqual(RolloutClient().url, "http://127.0.0.1:7878")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def test_an_unreachable_gateway_is_a_rollout_error(self):
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        client = RolloutClient(f"http://127.0.0.1:{port}", timeout=5)
        with self.assertRaises(RolloutConnectionError) as e:
            client.job("nope")
        self.assertIsInstance(e.exception, RolloutError)
        self.assertEqual(e.exception.status, 0)
        self.assertIn(f"127.0.0.1:{port}", str(e.exception))
        with self.assertRaises(RolloutConnectionError):
            list(client.groups("b", retries=0))

    def test_a_result_without_a_trajectory_is_refused_by_name(self):
        g = group(1, [1.0], [1], [1])
        g["results"][0]["output"] = {"run": {"answer": "synthetic"}}
        with self.assertRaisesRegex(ValueError, "j1-0"):
            to_tensors([g])


class AsyncPool(unittest.TestCase):
    def test_the_async_client_runs_many_blocking_calls_at_once(self):
        """Forty calls at once each hold a thread (as forty long polls would): the
        client's own pool runs them together, where the event loop's default executor
        (a handful of threads) would queue them and the barrier would break."""
        n = 40
        barrier = threading.Barrier(n, timeout=60)
        client = AsyncRolloutClient("http://127.0.0.1:9")

        async def main():
            return await asyncio.gather(*(client._call(barrier.wait) for _ in range(n)))

        try:
            arrivals = asyncio.run(main())
        finally:
            client.close()
        self.assertEqual(sorted(arrivals), list(range(n)))


class AgainstTheService(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        bin_dir = os.environ.get("ROLLOUT_BIN_DIR", str(ROOT / "target" / "debug"))
        cls.svc = LocalService(bin_dir, str(ROOT / "examples" / "agent-policy.json"))
        cls.svc.__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.svc.stop()

    def test_a_batch_yields_k_informative_groups_that_become_tensors(self):
        client = self.svc.client()
        view = client.submit_batch(agent_prompts(), group_size=4, target_groups=2,
                                   max_groups_in_flight=4, policy_version=7,
                                   batch_id="py-step-1")
        self.assertEqual(view["batch"]["status"], "running")
        again = client.submit_batch(agent_prompts(), group_size=4, target_groups=2,
                                    max_groups_in_flight=4, policy_version=7,
                                    batch_id="py-step-1")
        self.assertTrue(again["duplicate"])
        groups = list(client.groups("py-step-1"))
        final = client.batch("py-step-1")["batch"]
        # The stand-in plays weighted variants, so most groups of 4 disagree; 32
        # prompts are far more than two informative groups need.
        self.assertEqual(final["status"], "complete", (final, self.svc.log("up")[-3000:]))
        self.assertEqual(len(groups), 2)
        self.assertEqual(final["counters"]["informative"], 2)
        self.assertEqual([g["rank"] for g in groups], [1, 2])
        for g in groups:
            rewards = [r["reward"] for r in g["results"]]
            self.assertEqual(g.rewards, rewards)
            traj = g.results[0].trajectory
            self.assertEqual(len(traj.loss_mask), len(traj.response_ids))
            self.assertEqual(traj.samples, [traj], "an episode of the built-in loop is one sample")
            self.assertEqual(len(rewards), 4)
            self.assertGreater(len(set(rewards)), 1, "an accepted group is informative")
            for r in g["results"]:
                self.assertEqual(r["output"]["metadata"]["policy_version"], 7)
        t = to_tensors(groups)
        n = 4 * len(groups)
        self.assertEqual(len(t["responses"]), n)
        for row in range(n):
            self.assertEqual(len(t["response_mask"][row]), len(t["responses"][row]))
            self.assertIn(1, t["response_mask"][row], "the model produced tokens")
        # The groups are also in the batch's view, with the same results.
        self.assertEqual([g["rank"] for g in client.batch("py-step-1")["groups"]],
                         [g["rank"] for g in groups])

    def test_a_weight_update_stops_the_servers_until_the_resume(self):
        client = self.svc.client()
        servers = [b["url"] for b in client._request("GET", "/v1/backends")]
        self.assertTrue(servers, "rollout up registers its stand-in servers")

        def paused():
            return {json.loads(urllib.request.urlopen(u + "/is_paused").read())["is_paused"]
                    for u in servers}

        before = (client.policy().get("current") or {}).get("version", -1)
        view = client.begin_weight_update(before + 1, mode="abort", lease_s=60)
        self.assertEqual(view["pause"]["version"], before + 1)
        self.assertTrue(all(b["ok"] for b in view["backends"]), view)
        self.assertEqual(paused(), {True})
        with self.assertRaises(RolloutError) as e:
            client.announce_policy(before + 2)
        self.assertEqual(e.exception.status, 409)
        view = client.resume(before + 1)
        self.assertEqual(view["current"]["version"], before + 1)
        self.assertEqual(paused(), {False})
        self.assertEqual(client.announce_policy(before + 2)["current"]["version"], before + 2)

    def test_bad_input_names_the_field_and_cancel_ends_a_batch(self):
        client = self.svc.client()
        with self.assertRaises(RolloutError) as e:
            client.submit_batch(agent_prompts(), group_size=1, target_groups=1)
        self.assertEqual((e.exception.status, e.exception.field), (400, "group_size"))
        client.submit_batch(agent_prompts(), group_size=2, target_groups=4,
                            batch_id="py-cancelled")
        view = client.cancel("py-cancelled")
        self.assertEqual(view["batch"]["status"], "cancelled")
        self.assertEqual(list(client.groups("py-cancelled")), view["groups"])
        with self.assertRaises(RolloutError) as e:
            client.cancel("py-cancelled")
        self.assertEqual(e.exception.status, 409)

    def test_plain_jobs_come_back_in_the_order_of_the_tasks(self):
        client = self.svc.client()
        # Later tasks are quicker: they end first, and come back in task order anyway.
        tasks = [{"kind": "synthetic", "client_id": f"t{i}",
                  "spec": {"run_ms": 300 - 60 * i, "reward": i / 10},
                  "metadata": {"i": i}} for i in range(5)]
        results = client.run(tasks, batch_id="py-plain", timeout=120)
        self.assertEqual([r["client_id"] for r in results], [f"t{i}" for i in range(5)])
        self.assertEqual([r["reward"] for r in results], [i / 10 for i in range(5)])
        self.assertEqual([r["output"]["metadata"]["i"] for r in results], list(range(5)))
        # The same through the typed attributes (a result is still the JSON dict).
        self.assertEqual([r.metadata["i"] for r in results], list(range(5)))
        self.assertTrue(all(r.ok and r.trajectory is None for r in results))
        self.assertEqual([r.reward for r in results], [i / 10 for i in range(5)])
        # A re-run finds them submitted and done, and returns the same.
        again = client.run(tasks, batch_id="py-plain", timeout=60)
        self.assertEqual([r["job_id"] for r in again], [r["job_id"] for r in results])
        view = client.job(results[0].job_id)
        self.assertEqual(view["job"]["status"], "done")
        self.assertEqual((view.job.status, view.job.kind), ("done", "synthetic"))
        self.assertEqual(view.result.reward, 0.0)
        streamed = list(client.stream_results("py-plain", count=5, timeout=30))
        self.assertEqual(sorted(r["job_id"] for r in streamed),
                         sorted(r["job_id"] for r in results))

    def test_the_async_client_has_the_same_surface(self):
        import asyncio
        import inspect

        sync_methods = {n for n, f in inspect.getmembers(RolloutClient, inspect.isfunction)
                        if not n.startswith("_")}
        async_methods = {n for n, f in inspect.getmembers(AsyncRolloutClient, inspect.isfunction)
                         if not n.startswith("_")}
        # `close` stops the async client's own thread pool, which the sync one has not.
        self.assertEqual(sync_methods, async_methods - {"close"})

        async def go():
            client = AsyncRolloutClient(self.svc.url)
            tasks = [{"kind": "synthetic", "spec": {"run_ms": 50 * (3 - i), "reward": float(i)}}
                     for i in range(3)]
            # Two batches at once on one event loop.
            a, b = await asyncio.gather(client.run(tasks, batch_id="py-async-a", timeout=60),
                                        client.run(tasks, batch_id="py-async-b", timeout=60))
            streamed = [r async for r in client.stream_results("py-async-a", count=3, timeout=30)]
            return a, b, streamed

        a, b, streamed = asyncio.run(go())
        self.assertEqual([r["reward"] for r in a], [0.0, 1.0, 2.0])
        self.assertEqual([r["reward"] for r in b], [0.0, 1.0, 2.0])
        self.assertEqual(len(streamed), 3)

    def test_a_job_is_cancelled_and_a_wait_times_out(self):
        client = self.svc.client()
        sub = client.submit([{"kind": "synthetic", "spec": {"run_ms": 60000}}],
                            batch_id="py-cancel-job")
        job_id = sub["jobs"][0]["id"]
        with self.assertRaises(RolloutTimeout):
            list(client.stream_results("py-cancel-job", count=1, timeout=0.5))
        self.assertEqual(client.cancel_job(job_id)["id"], job_id)
        (r,) = client.stream_results("py-cancel-job", count=1, timeout=60)
        self.assertEqual(r["status"], "cancelled")
        with self.assertRaises(RolloutError) as e:
            client.job("no-such-job")
        self.assertEqual(e.exception.status, 404)

    def test_a_kept_batchs_groups_are_adopted_by_the_next(self):
        client = self.svc.client()
        client.submit_batch(agent_prompts(), group_size=2, target_groups=4,
                            on_cancel="keep", batch_id="py-kept")
        view = client.cancel("py-kept")
        kept = view["batch"]["counters"]["kept_groups"]
        self.assertEqual((view["batch"]["on_cancel"], view["cancelling"]), ("keep", 0))
        self.assertGreater(kept, 0)
        nxt = client.submit_batch(agent_prompts(), group_size=2, target_groups=1,
                                  carry_from="py-kept", batch_id="py-adopter")
        self.assertEqual(nxt["batch"]["carry_from"], "py-kept")
        self.assertEqual(nxt["batch"]["counters"]["adopted_groups"], kept)
        client.cancel("py-adopter")


if __name__ == "__main__":
    unittest.main()


class Stopping(unittest.TestCase):
    def test_a_stop_with_work_in_flight_leaves_nothing_of_the_service(self):
        """SIGTERM to the local service mid-batch: its sandboxes, their mounted
        workspaces and loop devices, its nats-server and its processes all go."""
        bin_dir = os.environ.get("ROLLOUT_BIN_DIR", str(ROOT / "target" / "debug"))
        svc = LocalService(bin_dir, str(ROOT / "examples" / "agent-policy.json"), workers=1)
        svc.__enter__()
        try:
            svc.client().submit_batch(agent_prompts(), group_size=4, target_groups=32,
                                      max_groups_in_flight=8, batch_id="py-stopped")
            deadline = time.monotonic() + 120
            while not any("rollout-sandbox serve" in p
                          for p in svc.leftovers(wait=0)["processes"]):
                self.assertLess(time.monotonic(), deadline,
                                "no sandbox started:\n" + svc.log("up")[-3000:])
                time.sleep(0.1)
            state = svc._dir
        except BaseException:
            svc.stop()
            raise
        svc.stop()  # raises, naming them, if anything of the service is left
        self.assertFalse(os.path.exists(state), "the state is removed")
        self.assertEqual(svc.leftovers(wait=0),
                         {"processes": [], "mounts": [], "loop_devices": []})
