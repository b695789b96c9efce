"""Adapters that plug the rollout service into RL trainers as their rollout step.

- :mod:`rollout_client.adapters.verl`: an agent loop (``AgentLoopBase``) for verl;
- :mod:`rollout_client.adapters.slime`: a custom generate function for slime;
- :mod:`rollout_client.adapters.skyrl`: a generator (``GeneratorInterface``) for SkyRL.

Each turns the trainer's prompt into a rollout task, lets the service run and grade the
episode (its sandbox, tools and grader), and hands the trainer the episode's tokens,
loss mask, logprobs and reward in the trainer's own types. Each imports its trainer only
when its trainer-typed class is first used, so ``rollout_client`` and the conversion
functions here stay standard library only.

This module holds what the three share: the default mapping from a dataset row to a
task, the trainer's sampling parameters as the task's defaults, and :class:`Episodes`,
which runs many single episodes at once over one stream of results.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import json
import sys
import uuid
from typing import Any, Callable, Dict, List, Mapping, Optional

from .. import RolloutClient, RolloutError, RolloutTimeout
from ..types import JobResult, Trajectory

__all__ = [
    "EPISODE_KINDS",
    "EpisodeFailed",
    "Episodes",
    "SAMPLING_KEYS",
    "TRUNCATED",
    "default_task",
    "lazy_class",
    "load_function",
    "plain",
    "scored_trajectory",
    "shared_episodes",
    "turn_versions",
    "with_trainer_sampling",
]

Json = Dict[str, Any]

#: Finish reasons of an episode that was cut short rather than ended by the model
#: (the turn limit, the context limit, one turn's token limit, the wall clock).
TRUNCATED = frozenset({"max_turns", "context_length", "turn_length", "timeout"})

#: The trainer's sampling parameters a task takes when it sets none of its own.
SAMPLING_KEYS = ("temperature", "top_p", "top_k")

#: Task kinds whose spec has ``sampling`` and ``limits`` (and whose result has tokens).
EPISODE_KINDS = frozenset({"agent", "agent_program"})


class EpisodeFailed(Exception):
    """The service ended a job without scoring it (``failed``, ``timed_out``,
    ``cancelled`` or ``stale``): there is no reward to train on. ``result`` is the job's
    result, with the service's ``error``."""

    def __init__(self, result: JobResult):
        super().__init__(f"job {result.job_id} ended {result.status}: {result.error}")
        self.result = result


def plain(value: Any) -> Any:
    """``value`` as JSON-ready Python: numpy arrays and scalars (what a parquet row or a
    trainer's non-tensor batch holds) become lists and numbers, tuples lists."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist"):
        return plain(value.tolist())
    return value


def default_task(messages: Any, fields: Mapping[str, Any], ground_truth: Any = None) -> Json:
    """The task for a dataset row: its ``task`` field (a task as JSON, or its JSON
    text), looked up in ``fields`` and then in ``fields["extra_info"]``; else, when the
    row has chat ``messages`` and a scalar ``ground_truth``, an ``agent`` episode on those
    messages graded by the ``math`` grader against it (the shape of verl's and SkyRL's
    GSM8K/MATH datasets). Anything else is refused with the reason: the service runs
    and grades the episode, so the row must say how."""
    task = fields.get("task")
    extra = fields.get("extra_info")
    if task is None and isinstance(extra, Mapping):
        task = extra.get("task")
    if isinstance(task, str):
        task = json.loads(task)
    if isinstance(task, Mapping):
        return plain(task)
    if task is not None:
        raise ValueError(f"the row's task must be a JSON object, not {type(task).__name__}")
    messages = plain(messages)
    ground_truth = plain(ground_truth)
    if isinstance(messages, list) and messages and isinstance(ground_truth, (str, int, float)):
        return {
            "kind": "agent",
            "spec": {"messages": messages, "grader": {"type": "math", "answer": str(ground_truth)}},
        }
    raise ValueError(
        "the row has no `task` (in its fields or its extra_info) and no chat messages with "
        "a scalar ground truth to grade them against: give the adapter a task function"
    )


def load_function(spec: Any) -> Optional[Callable[..., Any]]:
    """A function given as itself or as a dotted path (``pkg.module.fn`` or
    ``pkg.module:fn``), as trainers' configuration files name user code; ``None`` when
    ``spec`` is empty."""
    if not spec:
        return None
    if callable(spec):
        return spec
    module, sep, name = str(spec).partition(":")
    if not sep:
        module, _, name = str(spec).rpartition(".")
    return getattr(importlib.import_module(module), name)


def with_trainer_sampling(task: Json, sampling: Mapping[str, Any], **limits: Any) -> Json:
    """A copy of ``task`` whose ``spec.sampling`` takes the trainer's temperature, top_p
    and top_k, and whose ``spec.limits`` takes ``limits``, wherever the task sets none.
    The task decides how the policy samples; the trainer's settings (including its
    greedy ones for validation) are the defaults. Other kinds are returned unchanged:
    their specs have neither."""
    task = copy.deepcopy(dict(task))
    if task.get("kind") not in EPISODE_KINDS:
        return task
    spec = task.setdefault("spec", {})
    own = spec.setdefault("sampling", {})
    for key in SAMPLING_KEYS:
        if sampling.get(key) is not None:
            own.setdefault(key, plain(sampling[key]))
    own_limits = spec.setdefault("limits", {})
    for key, value in limits.items():
        if value is not None:
            own_limits.setdefault(key, value)
    return task


def lazy_class(module: str, name: str, make: Callable[[], type]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that makes the class ``name`` with ``make`` when it is
    first looked up (a class derived from a trainer's base class imports the trainer
    then, not when the module is imported), and names it as ``module``'s attribute,
    where Hydra's ``_target_`` and pickle look it up."""

    def getattr_(attr: str) -> Any:
        if attr != name:
            raise AttributeError(f"module {module!r} has no attribute {attr!r}")
        cls = make()
        cls.__module__ = module
        cls.__qualname__ = name
        setattr(sys.modules[module], name, cls)
        return cls

    return getattr_


def scored_trajectory(result: JobResult) -> Trajectory:
    """The trajectory of a scored episode, checked: raises :class:`EpisodeFailed` for a
    job that did not end ``done``, and ``ValueError`` for a task without tokens or a
    trajectory whose mask or logprobs do not line up with its response."""
    if not result.ok:
        raise EpisodeFailed(result)
    traj = result.trajectory
    if traj is None:
        raise ValueError(
            f"job {result.job_id} has no token trajectory: only agent and agent_program "
            "tasks carry one"
        )
    n = len(traj.response_ids)
    if len(traj.loss_mask) != n or len(traj.logprobs) != n:
        raise ValueError(
            f"job {result.job_id}: {n} response tokens, {len(traj.loss_mask)} mask "
            f"entries, {len(traj.logprobs)} logprobs"
        )
    return traj


def turn_versions(traj: Trajectory) -> List[int]:
    """The policy version of each generation, in order: one per turn, or more for a
    turn that a weight update cut and that went on under a newer version (its model
    tokens lie in several of ``policy_versions``' spans). Empty when no version was
    ever announced."""
    spans = traj.policy_versions
    versions: List[int] = []
    for turn in traj.turns:
        start, end = turn.get("model_range") or (0, 0)
        seen: List[int] = []
        for span in spans:
            if span["from"] < end and start < span["to"] and span["version"] not in seen:
                seen.append(span["version"])
        versions.extend(seen)
    return versions


class Episodes:
    """Runs one task per call, for trainers that ask for one sample at a time and keep
    many such calls in flight on one event loop (verl's agent loop, slime's generate
    function).

    Each task is submitted on its own into a batch this object owns, under a
    ``client_id`` it makes (a task's own is replaced: it only names the task within a
    batch); one long poll of the batch's results hands each to the call waiting for it.
    So a thousand episodes in flight hold one worker thread, where a thousand
    ``AsyncRolloutClient.run`` calls would each hold one of the event loop's few
    executor threads for a whole episode, and the rest would queue behind them.

    ``timeout`` (seconds) bounds each episode: its job is then cancelled and the call
    raises :class:`RolloutTimeout`; a call cancelled by its caller cancels its job too.
    A dropped connection is retried ``retries`` times in a row; then every waiting call
    raises the error. Use one instance per event loop."""

    def __init__(
        self,
        client: RolloutClient,
        batch_id: Optional[str] = None,
        timeout: Optional[float] = None,
        retries: int = 5,
    ):
        self.client = client
        self.batch_id = batch_id or f"episodes-{uuid.uuid4().hex[:12]}"
        self.timeout = timeout
        self.retries = retries
        self._cursor = 0
        self._waiting: Dict[str, "asyncio.Future[JobResult]"] = {}
        self._watcher: Optional["asyncio.Task[None]"] = None

    async def run(self, task: Json) -> JobResult:
        """Submits ``task`` and returns its result once the job has ended."""
        key = uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        waiter: "asyncio.Future[JobResult]" = loop.create_future()
        # Waiting before submitting: the result cannot come before anyone waits for it.
        self._waiting[key] = waiter
        job_id: Optional[str] = None
        try:
            answer = await asyncio.to_thread(
                self.client.submit, [dict(task, client_id=key)], self.batch_id
            )
            job_id = answer["jobs"][0]["id"]
            if self._watcher is None or self._watcher.done():
                self._watcher = loop.create_task(self._watch())
            return await asyncio.wait_for(waiter, self.timeout)
        except asyncio.TimeoutError:
            self._abandon(loop, job_id)
            raise RolloutTimeout(
                f"job {job_id} of batch {self.batch_id} had not ended after {self.timeout} s"
            ) from None
        except asyncio.CancelledError:
            self._abandon(loop, job_id)
            raise
        finally:
            self._waiting.pop(key, None)

    def _abandon(self, loop: asyncio.AbstractEventLoop, job_id: Optional[str]) -> None:
        """Cancels an episode nobody waits for any more, without waiting for the answer
        (the caller may itself be being cancelled)."""
        if job_id is not None:
            loop.run_in_executor(None, self._cancel_quietly, job_id)

    def _cancel_quietly(self, job_id: str) -> None:
        try:
            self.client.cancel_job(job_id)
        except RolloutError:
            pass  # it ended meanwhile (409), or the gateway is gone: nothing left to stop

    async def _watch(self) -> None:
        """Long-polls the batch's results while calls wait, handing each result to its
        call; results nobody waits for (abandoned episodes) are dropped. It ends as
        soon as no call waits, so that no poll outlives the episodes (an event loop
        that closes waits for its threads)."""
        failures = 0
        while any(not waiter.done() for waiter in self._waiting.values()):
            try:
                page = await asyncio.to_thread(
                    self.client.results, self.batch_id, self._cursor, 5000
                )
            except RolloutError as e:
                failures += 1
                if failures > self.retries:
                    for waiter in self._waiting.values():
                        if not waiter.done():
                            waiter.set_exception(e)
                    return
                await asyncio.sleep(min(2.0, 0.1 * 2**failures))
                continue
            failures = 0
            self._cursor = page.next_cursor or self._cursor
            for result in page.results:
                waiter = self._waiting.get(result.client_id or "")
                if waiter is not None and not waiter.done():
                    waiter.set_result(result)


_shared: Dict[tuple, Episodes] = {}


def shared_episodes(
    gateway: Optional[str], token: Optional[str], timeout: Optional[float]
) -> Episodes:
    """The process's :class:`Episodes` for a gateway. Trainers make their agent loop or
    call their generate function afresh for every sample; sharing one keeps one result
    stream per process instead of one per sample."""
    key = (gateway, token, timeout, id(asyncio.get_running_loop()))
    if key not in _shared:
        _shared[key] = Episodes(RolloutClient(gateway, token), timeout=timeout)
    return _shared[key]
