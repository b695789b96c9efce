"""Trainer-side client of the rollout service.

Jobs: :meth:`RolloutClient.submit` a list of tasks, then :meth:`RolloutClient.results`
(one page), :meth:`RolloutClient.stream_results` (every result as it arrives) or
:meth:`RolloutClient.run` (submit and wait, results in the order of the tasks); fetch one
job with :meth:`RolloutClient.job`, cancel it with :meth:`RolloutClient.cancel_job`.

Sampling batches: a trainer hands the service a prompt pool and asks for K groups of G samples whose
rewards differ (DAPO's dynamic sampling); the service launches groups as earlier ones
end, accepts informative groups until it has K, and cancels the rest. This module
submits such batches, iterates over the accepted groups as they are decided (Server-Sent
Events, resumed after a dropped connection), cancels batches, and turns accepted groups
into the padded arrays a GRPO/DAPO step consumes, under the names verl's rollout output
uses.

Standard library only; ``to_tensors`` returns numpy arrays or torch tensors when asked
and installed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import http.client
import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Optional, Sequence

from .types import (
    Batch,
    BatchView,
    Group,
    Job,
    JobResult,
    JobView,
    ResultPage,
    Trajectory,
)

__all__ = [
    "AsyncRolloutClient",
    "Batch",
    "BatchView",
    "Group",
    "Job",
    "JobResult",
    "JobView",
    "ResultPage",
    "Trajectory",
    "RolloutClient",
    "RolloutError",
    "RolloutConnectionError",
    "RolloutTimeout",
    "to_tensors",
    "parse_sse",
]

#: The client's version (the package's).
__version__ = "0.1.0"

#: Where ``rollout serve`` and ``rollout up`` listen unless configured otherwise.
DEFAULT_URL = "http://127.0.0.1:7878"

Json = Dict[str, Any]


class RolloutError(Exception):
    """The service refused a request: ``status`` is the HTTP status, ``field`` the
    offending field of bad input (e.g. ``prompts[3].spec.run_ms``)."""

    def __init__(self, status: int, message: str, field: Optional[str] = None):
        super().__init__(f"{status}: {message}" + (f" (field `{field}`)" if field else ""))
        self.status = status
        self.message = message
        self.field = field


class RolloutConnectionError(RolloutError):
    """The gateway could not be reached (wrong URL, service down, connection cut):
    ``status`` is 0."""

    def __init__(self, url: str, reason: object):
        super().__init__(
            0,
            f"cannot reach the gateway at {url}: {reason} "
            "(is `rollout serve` or `rollout up` running? check the URL)",
        )
        self.url = url


class RolloutTimeout(RolloutError):
    """A wait given a ``timeout`` ran out before what it waited for came: ``status``
    is 0."""

    def __init__(self, message: str):
        super().__init__(0, message)


def _error(status: int, body: bytes) -> RolloutError:
    """The service's error answer (``{"error", "field"}``, or plain text) as an
    exception."""
    text = body.decode(errors="replace")
    try:
        err = json.loads(text)
    except ValueError:
        return RolloutError(status, text)
    if not isinstance(err, dict):
        return RolloutError(status, text)
    return RolloutError(status, err.get("error", text), err.get("field"))


class RolloutClient:
    """A client of one gateway.

    ``url`` defaults to ``$ROLLOUT_GATEWAY``, else ``http://127.0.0.1:7878`` (where
    ``rollout up`` listens by default). ``token`` defaults to
    ``$ROLLOUT_GATEWAY_TOKEN``: a gateway with ``gateway.token`` set answers 401 to
    requests without it. ``timeout`` bounds each HTTP request (seconds)."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        timeout: float = 60.0,
    ):
        self.url = (url or os.environ.get("ROLLOUT_GATEWAY") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("ROLLOUT_GATEWAY_TOKEN")
        self.timeout = timeout

    # -- plumbing -----------------------------------------------------------------

    def _headers(self) -> Dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    def _request(self, method: str, path: str, body: Optional[Json] = None) -> Json:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers=self._headers()
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raise _error(e.code, e.read()) from None
        except urllib.error.URLError as e:
            raise RolloutConnectionError(self.url, e.reason) from None
        except (OSError, http.client.HTTPException, socket.timeout) as e:
            raise RolloutConnectionError(self.url, e) from None

    # -- jobs -----------------------------------------------------------------------

    def submit(self, tasks: Sequence[Json], batch_id: Optional[str] = None) -> Json:
        """Submits ``tasks`` (``{"kind", "spec", "client_id"?, "group_id"?,
        "metadata"?}``) into ``batch_id`` (a new batch when absent) with
        ``POST /v1/jobs``; returns ``{"batch_id", "jobs": [{"id", "client_id",
        "duplicate"}]}``, one entry per task, in order. A task whose ``client_id`` the
        batch already holds is not submitted again (``duplicate``)."""
        body: Json = {"tasks": list(tasks)}
        if batch_id is not None:
            body["batch_id"] = batch_id
        return self._request("POST", "/v1/jobs", body)

    def job(self, job_id: str) -> JobView:
        """One job: ``{"job": {...state, stage, timings...}, "result": {...} | None,
        "events": [...]}``."""
        return JobView(self._request("GET", f"/v1/jobs/{urllib.parse.quote(job_id)}"))

    def cancel_job(self, job_id: str) -> Json:
        """Cancels a job that has not ended; returns ``{"id", "status"}``."""
        return self._request("POST", f"/v1/jobs/{urllib.parse.quote(job_id)}/cancel")

    def results(
        self,
        batch_id: Optional[str] = None,
        after: int = 0,
        wait_ms: int = 0,
        limit: Optional[int] = None,
    ) -> ResultPage:
        """One page of results (``GET /v1/results``) with ``seq`` above ``after``:
        ``{"results": [...], "next_cursor": N}``, waiting up to ``wait_ms`` when none is
        ready. A result is ``{"seq", "job_id", "batch_id", "group_id", "client_id",
        "status", "reward", "error", "output": {"init", "run", "eval", "metadata"}}``; the
        task's ``metadata`` comes back under ``output.metadata``."""
        query: Json = {"after": after, "wait_ms": wait_ms}
        if batch_id is not None:
            query["batch"] = batch_id
        if limit is not None:
            query["limit"] = limit
        return ResultPage(self._request("GET", "/v1/results?" + urllib.parse.urlencode(query)))

    def stream_results(
        self,
        batch_id: Optional[str] = None,
        after: int = 0,
        count: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> Iterator[JobResult]:
        """Yields results as they arrive, in ``seq`` order (long polls of
        :meth:`results`), until ``count`` have come (forever when ``None``). Raises
        :class:`RolloutTimeout` when ``timeout`` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        seen = 0
        while count is None or seen < count:
            wait = 5.0
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RolloutTimeout(
                        f"{seen} of {count if count is not None else 'the'} results of "
                        f"batch {batch_id} came within {timeout} s"
                    )
                wait = min(wait, left)
            page = self.results(batch_id, after=after, wait_ms=int(wait * 1000))
            after = page["next_cursor"]
            for r in page.results:
                seen += 1
                yield r
                if count is not None and seen >= count:
                    return

    def run(
        self,
        tasks: Sequence[Json],
        batch_id: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> List[JobResult]:
        """Submits ``tasks`` and waits for their results; returns them in the order
        of ``tasks`` (as SkyRL's generator and most trainers want them), whatever order
        they ended in. ``batch_id`` defaults to a new batch; ``timeout`` (seconds) bounds
        the wait (:class:`RolloutTimeout`). Tasks a re-run finds already submitted (by
        ``client_id``) are waited for too."""
        submitted = self.submit(tasks, batch_id)
        order = {j["id"]: i for i, j in enumerate(submitted["jobs"])}
        out: List[Optional[JobResult]] = [None] * len(order)
        waiting = len(order)
        # Results already there (a re-run of a finished batch) come first.
        for r in self.stream_results(submitted["batch_id"], count=None, timeout=timeout):
            i = order.get(r["job_id"])
            if i is not None and out[i] is None:
                out[i] = r
                waiting -= 1
                if waiting == 0:
                    break
        return [r for r in out if r is not None]

    # -- sampling batches -----------------------------------------------------------

    def submit_batch(
        self,
        prompts: Sequence[Json],
        group_size: int,
        target_groups: int,
        *,
        max_groups_in_flight: Optional[int] = None,
        max_groups: Optional[int] = None,
        informative: Optional[Json] = None,
        policy_version: Optional[int] = None,
        max_staleness: Optional[int] = None,
        on_cancel: Optional[str] = None,
        carry_from: Optional[str] = None,
        batch_id: Optional[str] = None,
    ) -> BatchView:
        """Starts a sampling batch (``POST /v1/batches``) and returns its view:
        ``{"batch": {...}, "groups": [...], "duplicate": bool}``.

        ``prompts`` are tasks (``{"kind", "spec", "metadata"}``) without ``client_id`` or
        ``group_id``. ``informative`` is e.g. ``{"rule": "reward_std", "eps": 0.05}`` or
        ``{"min_mean": 0.1, "max_mean": 0.9}`` (default: rewards not all equal). Passing
        the same ``batch_id`` again returns the existing batch, so a retry after a lost
        answer creates nothing twice. ``max_staleness`` (policy versions) ends a sample
        whose oldest token is further behind than that when it is scored as ``stale``,
        and its group is replaced by the next prompt. ``on_cancel="keep"`` keeps the
        groups still running when the batch ends (partial rollouts) instead of cancelling
        them; the next batch adopts them with ``carry_from=<this batch's id>``, and they
        come with its groups (each with ``carried_from``).
        """
        body: Json = {
            "prompts": list(prompts),
            "group_size": group_size,
            "target_groups": target_groups,
        }
        for key, value in (
            ("max_groups_in_flight", max_groups_in_flight),
            ("max_groups", max_groups),
            ("informative", informative),
            ("policy_version", policy_version),
            ("max_staleness", max_staleness),
            ("on_cancel", on_cancel),
            ("carry_from", carry_from),
            ("batch_id", batch_id),
        ):
            if value is not None:
                body[key] = value
        return BatchView(self._request("POST", "/v1/batches", body))

    # -- policy versions and weight updates --------------------------------------------

    def policy(self) -> Json:
        """The current policy version, the weight update in progress, the latest
        versions (``GET /v1/policy``)."""
        return self._request("GET", "/v1/policy")

    def announce_policy(self, version: int) -> Json:
        """The servers' weights are now at ``version`` (updated without a pause): every
        model token generated from now on carries it."""
        return self._request("POST", "/v1/policy", {"version": version})

    def begin_weight_update(
        self, version: int, mode: str = "abort", lease_s: Optional[int] = None
    ) -> Json:
        """Stops generation for a weight update to ``version`` and returns once every
        backend has stopped. ``mode``: ``"abort"`` (turns in flight go on from their
        tokens after the resume), ``"pause"`` (frozen, finished after it) or ``"wait"``
        (run to their end first). ``lease_s`` bounds the pause (default 600 s): without
        a resume by then the service resumes on its own and ``version`` does not become
        current."""
        body: Json = {"version": version, "mode": mode}
        if lease_s is not None:
            body["lease_s"] = lease_s
        return self._request("POST", "/v1/policy", body)

    def resume(self, version: int) -> Json:
        """Ends the weight update to ``version``: it becomes current and generation goes
        on."""
        return self._request("POST", f"/v1/policy/{int(version)}/resume")

    def batch(self, batch_id: str) -> BatchView:
        """The batch: parameters, status, counters and accepted groups (as many as
        fit in one page; ``more_groups_after`` is then set, and :meth:`groups` from
        there yields the rest)."""
        return BatchView(self._request("GET", f"/v1/batches/{urllib.parse.quote(batch_id)}"))

    def cancel(self, batch_id: str) -> BatchView:
        """Cancels a running batch: nothing more is launched, the rest is cancelled."""
        return BatchView(
            self._request("POST", f"/v1/batches/{urllib.parse.quote(batch_id)}/cancel")
        )

    def groups(
        self,
        batch_id: str,
        after: int = 0,
        retries: int = 5,
        timeout: Optional[float] = None,
    ) -> Iterator[Group]:
        """Yields the batch's accepted groups in rank order as they are decided, and
        returns once the batch has ended and every accepted group was yielded. A dropped
        connection is resumed from the last rank seen (up to ``retries`` times in a
        row; then :class:`RolloutConnectionError`). ``timeout`` (seconds) bounds the
        whole iteration: :class:`RolloutTimeout` when the batch has not ended by then.

        The batch's counters read (:meth:`batch`) right after the last group are not
        final yet while cancelled samples are still being ended; read them once
        ``batch()["batch"]["status"]`` is no longer ``running``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        failures = 0
        while True:
            parsed = urllib.parse.urlsplit(self.url)
            conn_type = (
                http.client.HTTPSConnection
                if parsed.scheme == "https"
                else http.client.HTTPConnection
            )
            read_timeout = self.timeout
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RolloutTimeout(
                        f"batch {batch_id} had not ended after {timeout} s ({after} groups yielded)"
                    )
                read_timeout = min(read_timeout, left)
            conn = conn_type(parsed.netloc, timeout=read_timeout)
            headers = self._headers()
            headers["Accept"] = "text/event-stream"
            if after:
                headers["Last-Event-ID"] = str(after)
            path = f"{parsed.path}/v1/batches/{urllib.parse.quote(batch_id)}/groups/stream"
            try:
                conn.request("GET", path, headers=headers)
                resp = conn.getresponse()
                if resp.status != 200:
                    raise _error(resp.status, resp.read())
                for event, data, _ in parse_sse(_until(resp, deadline, batch_id, timeout)):
                    failures = 0
                    if event == "group":
                        group = Group(json.loads(data))
                        after = group.rank
                        yield group
                    elif event == "end":
                        return
            except (OSError, http.client.HTTPException) as e:
                if deadline is not None and time.monotonic() >= deadline:
                    raise RolloutTimeout(
                        f"batch {batch_id} had not ended after {timeout} s ({after} groups yielded)"
                    ) from None
                failures += 1
                if failures > retries:
                    raise RolloutConnectionError(self.url, e) from None
                time.sleep(min(2.0, 0.1 * 2**failures))
            finally:
                conn.close()


class AsyncRolloutClient:
    """:class:`RolloutClient`'s surface for asyncio trainers (verl's agent loop, slime's
    rollout, SkyRL's generator): the same methods as coroutines, and ``groups`` and
    ``stream_results`` as async iterators. Each call runs the blocking client in a
    thread of the client's own pool (``max_workers`` threads, 64 by default, not the
    event loop's default executor, which has a handful and is shared with the trainer),
    so the event loop never waits on the network and no HTTP library beyond the
    standard one is needed. A ``run`` or a long poll holds its thread until it returns:
    for many one-task calls at once (a trainer's per-sample hook),
    ``rollout_client.adapters.Episodes`` shares one stream of results among them."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        timeout: float = 60.0,
        max_workers: int = 64,
    ):
        self.sync = RolloutClient(url, token, timeout)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="rollout-client"
        )

    def close(self) -> None:
        """Stops the client's threads once their calls return."""
        self._pool.shutdown(wait=False)

    @property
    def url(self) -> str:
        """The gateway's URL."""
        return self.sync.url

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def _iterate(self, it: Iterator[Any]) -> AsyncIterator[Any]:
        done = object()
        while True:
            item = await self._call(next, it, done)
            if item is done:
                return
            yield item

    async def submit(self, tasks: Sequence[Json], batch_id: Optional[str] = None) -> Json:
        """See :meth:`RolloutClient.submit`."""
        return await self._call(self.sync.submit, tasks, batch_id)

    async def job(self, job_id: str) -> JobView:
        """See :meth:`RolloutClient.job`."""
        return await self._call(self.sync.job, job_id)

    async def cancel_job(self, job_id: str) -> Json:
        """See :meth:`RolloutClient.cancel_job`."""
        return await self._call(self.sync.cancel_job, job_id)

    async def results(self, batch_id: Optional[str] = None, after: int = 0,
                      wait_ms: int = 0, limit: Optional[int] = None) -> ResultPage:
        """See :meth:`RolloutClient.results`."""
        return await self._call(self.sync.results, batch_id, after, wait_ms, limit)

    def stream_results(self, batch_id: Optional[str] = None, after: int = 0,
                       count: Optional[int] = None,
                       timeout: Optional[float] = None) -> AsyncIterator[JobResult]:
        """See :meth:`RolloutClient.stream_results`."""
        return self._iterate(self.sync.stream_results(batch_id, after, count, timeout))

    async def run(self, tasks: Sequence[Json], batch_id: Optional[str] = None,
                  timeout: Optional[float] = None) -> List[JobResult]:
        """See :meth:`RolloutClient.run`."""
        return await self._call(self.sync.run, tasks, batch_id, timeout)

    async def submit_batch(self, prompts: Sequence[Json], group_size: int,
                           target_groups: int, **options: Any) -> BatchView:
        """See :meth:`RolloutClient.submit_batch`."""
        return await self._call(self.sync.submit_batch, prompts, group_size, target_groups,
                                **options)

    async def batch(self, batch_id: str) -> BatchView:
        """See :meth:`RolloutClient.batch`."""
        return await self._call(self.sync.batch, batch_id)

    async def cancel(self, batch_id: str) -> BatchView:
        """See :meth:`RolloutClient.cancel`."""
        return await self._call(self.sync.cancel, batch_id)

    def groups(self, batch_id: str, after: int = 0, retries: int = 5,
               timeout: Optional[float] = None) -> AsyncIterator[Group]:
        """See :meth:`RolloutClient.groups`."""
        return self._iterate(self.sync.groups(batch_id, after, retries, timeout))

    async def policy(self) -> Json:
        """See :meth:`RolloutClient.policy`."""
        return await self._call(self.sync.policy)

    async def announce_policy(self, version: int) -> Json:
        """See :meth:`RolloutClient.announce_policy`."""
        return await self._call(self.sync.announce_policy, version)

    async def begin_weight_update(self, version: int, mode: str = "abort",
                                  lease_s: Optional[int] = None) -> Json:
        """See :meth:`RolloutClient.begin_weight_update`."""
        return await self._call(self.sync.begin_weight_update, version, mode, lease_s)

    async def resume(self, version: int) -> Json:
        """See :meth:`RolloutClient.resume`."""
        return await self._call(self.sync.resume, version)


def _until(lines: Any, deadline: Optional[float], batch_id: str, timeout: Any) -> Iterator[Any]:
    """``lines`` until ``deadline`` (keep-alive comments count: a stream that only
    keeps alive still ends at the deadline)."""
    for line in lines:
        if deadline is not None and time.monotonic() >= deadline:
            raise RolloutTimeout(f"batch {batch_id} had not ended after {timeout} s")
        yield line


def parse_sse(lines: Any) -> Iterator[tuple]:
    """Parses a Server-Sent Events byte stream (an iterable of lines) into
    ``(event, data, id)`` tuples; comments (keep-alives) are skipped."""
    event, data, ident = "message", [], None
    for raw in lines:
        line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        line = line.rstrip("\r\n")
        if not line:
            if data:
                yield event, "\n".join(data), ident
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            ident = value


def to_tensors(
    groups: Sequence[Json],
    pad_token_id: int = 0,
    backend: str = "list",
) -> Dict[str, Any]:
    """Turns accepted groups into the padded batch a GRPO/DAPO step consumes, one row
    per sample, under the names verl's rollout output uses:

    - ``prompts`` [N, P]: prompt token ids, left-padded with ``pad_token_id``;
    - ``responses`` [N, R]: response token ids (the model's tokens and the tool
      observations between its turns), right-padded;
    - ``input_ids``, ``attention_mask``, ``position_ids`` [N, P + R];
    - ``response_mask`` [N, R]: 1 on tokens the model produced, 0 on observations and
      padding (the loss mask);
    - ``rollout_log_probs`` [N, R]: the logprobs the inference server returned (0
      elsewhere);
    - ``token_level_scores`` [N, R]: the sample's reward on its last response token;
    - ``rewards`` [N]: the rewards; ``group_index`` [N]: the group's rank;
    - ``uid`` (list of N strings): the group each sample belongs to, for GRPO's
      per-group advantage.

    ``backend``: ``"list"`` (nested lists), ``"numpy"`` or ``"torch"``.
    """
    rows = []
    for group in groups:
        for result in group["results"]:
            run = (result.get("output") or {}).get("run") or {}
            if "prompt_ids" not in run or "response_ids" not in run:
                raise ValueError(
                    f"job {result.get('job_id')} has no token trajectory "
                    "(only agent episodes carry one)"
                )
            response = list(run["response_ids"])
            mask = list(run.get("loss_mask") or [1] * len(response))
            logprobs = list(run.get("logprobs") or [0.0] * len(response))
            if not (len(mask) == len(logprobs) == len(response)):
                raise ValueError(f"job {result.get('job_id')}: misaligned trajectory")
            rows.append(
                (
                    list(run["prompt_ids"]),
                    response,
                    mask,
                    logprobs,
                    float(result["reward"]),
                    f"{group['batch_id']}:{group['group_id']}",
                    int(group["rank"]),
                )
            )
    p_len = max((len(r[0]) for r in rows), default=0)
    r_len = max((len(r[1]) for r in rows), default=0)
    out: Dict[str, List[Any]] = {
        k: []
        for k in (
            "prompts",
            "responses",
            "input_ids",
            "attention_mask",
            "position_ids",
            "response_mask",
            "rollout_log_probs",
            "token_level_scores",
            "rewards",
            "group_index",
        )
    }
    uids = []
    for prompt, response, mask, logprobs, reward, uid, rank in rows:
        p_pad, r_pad = p_len - len(prompt), r_len - len(response)
        prompts = [pad_token_id] * p_pad + prompt
        responses = response + [pad_token_id] * r_pad
        attention = [0] * p_pad + [1] * (len(prompt) + len(response)) + [0] * r_pad
        # Positions count real tokens only (0 on padding), as verl computes them.
        positions, seen = [], 0
        for a in attention:
            positions.append(seen if a else 0)
            seen += a
        scores = [0.0] * r_len
        if response:
            scores[len(response) - 1] = reward
        out["prompts"].append(prompts)
        out["responses"].append(responses)
        out["input_ids"].append(prompts + responses)
        out["attention_mask"].append(attention)
        out["position_ids"].append(positions)
        out["response_mask"].append(mask + [0] * r_pad)
        out["rollout_log_probs"].append(logprobs + [0.0] * r_pad)
        out["token_level_scores"].append(scores)
        out["rewards"].append(reward)
        out["group_index"].append(rank)
        uids.append(uid)
    result: Dict[str, Any] = dict(out)
    if backend == "numpy":
        import numpy as np

        float_keys = {"rollout_log_probs", "token_level_scores", "rewards"}
        result = {
            k: np.asarray(v, dtype=np.float32 if k in float_keys else np.int64)
            for k, v in out.items()
        }
    elif backend == "torch":
        import torch

        float_keys = {"rollout_log_probs", "token_level_scores", "rewards"}
        result = {
            k: torch.tensor(v, dtype=torch.float32 if k in float_keys else torch.long)
            for k, v in out.items()
        }
    elif backend != "list":
        raise ValueError(f"backend must be list, numpy or torch, not {backend!r}")
    result["uid"] = uids
    return result
