"""Typed views of what the service returns.

Each record is the JSON object the API sent, so ``result["reward"]`` and code written
against the plain JSON keep working, with typed, documented attributes on top
(``result.reward``, ``result.trajectory.prompt_ids``). Nested objects come back as
records too (a group's ``results``, a job view's ``result``). Fields the service adds
later are in the dict even before this module names them.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

Json = Dict[str, Any]


class Record(dict):  # type: ignore[type-arg]
    """A JSON object from the service, with typed attributes for its fields."""

    def _obj(self, key: str) -> Json:
        value = self.get(key)
        return value if isinstance(value, dict) else {}


class Trajectory(Record):
    """An episode's tokens, in verl's agent-loop shape: ``prompt_ids``, then
    ``response_ids`` (model tokens and the observations between turns) with
    ``loss_mask`` (1 on model tokens) and the rollout ``logprobs`` aligned to them."""

    @property
    def prompt_ids(self) -> List[int]:
        return list(self.get("prompt_ids") or [])

    @property
    def response_ids(self) -> List[int]:
        return list(self.get("response_ids") or [])

    @property
    def loss_mask(self) -> List[int]:
        return list(self.get("loss_mask") or [])

    @property
    def logprobs(self) -> List[float]:
        return list(self.get("logprobs") or [])

    @property
    def turns(self) -> List[Json]:
        """Per model turn (or agent-program call): ``text``, ``model_range``,
        ``observation_range``, ``tools``, ``backend``, latencies."""
        return list(self.get("turns") or [])

    @property
    def finish_reason(self) -> Optional[str]:
        """``finished``, ``no_tool_call``, ``max_turns``, ``context_length``,
        ``turn_length``, ``timeout`` or ``exited`` (an agent program)."""
        return self.get("finish_reason")

    @property
    def answer(self) -> Optional[str]:
        return self.get("answer")

    @property
    def policy_versions(self) -> List[Json]:
        """Which policy version produced which model tokens: spans over
        ``response_ids``."""
        return list(self.get("policy_versions") or [])

    @property
    def policy_version_oldest(self) -> Optional[int]:
        return self.get("policy_version_oldest")

    @property
    def samples(self) -> List["Trajectory"]:
        """An agent program's training samples (its calls joined where each continues
        the last); a built-in episode is its one sample."""
        samples = self.get("samples")
        if isinstance(samples, list):
            return [Trajectory(s) for s in samples if isinstance(s, dict)]
        return [self]


class JobResult(Record):
    """One job's result: its status, reward, error and stage outputs."""

    @property
    def seq(self) -> int:
        return int(self.get("seq") or 0)

    @property
    def job_id(self) -> str:
        return str(self.get("job_id"))

    @property
    def batch_id(self) -> str:
        return str(self.get("batch_id"))

    @property
    def group_id(self) -> Optional[str]:
        return self.get("group_id")

    @property
    def client_id(self) -> Optional[str]:
        return self.get("client_id")

    @property
    def status(self) -> str:
        """``done``, ``failed``, ``timed_out``, ``cancelled`` or ``stale``."""
        return str(self.get("status"))

    @property
    def ok(self) -> bool:
        """Whether the job ended ``done`` (scored)."""
        return self.get("status") == "done"

    @property
    def reward(self) -> Optional[float]:
        r = self.get("reward")
        return None if r is None else float(r)

    @property
    def error(self) -> Optional[str]:
        return self.get("error")

    @property
    def metadata(self) -> Any:
        """The task's ``metadata``, as submitted (it comes back under
        ``output.metadata``)."""
        return self._obj("output").get("metadata")

    @property
    def trajectory(self) -> Optional[Trajectory]:
        """The episode's tokens (``output.run``), for jobs that have them (``agent``,
        ``agent_program``); ``None`` otherwise."""
        run = self._obj("output").get("run")
        if isinstance(run, dict) and "prompt_ids" in run:
            return Trajectory(run)
        return None

    @property
    def eval(self) -> Json:
        """EVAL's details (the grader's verdict, its reason)."""
        return dict(self._obj("output").get("eval") or {})


class Job(Record):
    """A job's stored state."""

    @property
    def id(self) -> str:
        return str(self.get("id"))

    @property
    def batch_id(self) -> str:
        return str(self.get("batch_id"))

    @property
    def kind(self) -> str:
        return str(self.get("kind"))

    @property
    def status(self) -> str:
        return str(self.get("status"))

    @property
    def stage(self) -> str:
        return str(self.get("stage"))

    @property
    def task(self) -> Json:
        return self._obj("task")


class JobView(Record):
    """``GET /v1/jobs/{id}``: the job, its result once it ended, its events."""

    @property
    def job(self) -> Job:
        return Job(self._obj("job"))

    @property
    def result(self) -> Optional[JobResult]:
        r = self.get("result")
        return JobResult(r) if isinstance(r, dict) else None

    @property
    def events(self) -> List[Json]:
        return list(self.get("events") or [])


class ResultPage(Record):
    """One page of results and the cursor for the next."""

    @property
    def results(self) -> List[JobResult]:
        return [JobResult(r) for r in self.get("results") or []]

    @property
    def next_cursor(self) -> int:
        return int(self.get("next_cursor") or 0)


class Group(Record):
    """An accepted group of a sampling batch: its samples' results, in order."""

    @property
    def batch_id(self) -> str:
        return str(self.get("batch_id"))

    @property
    def group_id(self) -> str:
        return str(self.get("group_id"))

    @property
    def rank(self) -> int:
        return int(self.get("rank") or 0)

    @property
    def carried_from(self) -> Optional[str]:
        """The batch that launched it, when it was adopted from a kept batch."""
        return self.get("carried_from")

    @property
    def results(self) -> List[JobResult]:
        return [JobResult(r) for r in self.get("results") or []]

    @property
    def rewards(self) -> List[Optional[float]]:
        return [r.reward for r in self.results]


class Batch(Record):
    """A sampling batch's parameters, status and counters."""

    @property
    def id(self) -> str:
        return str(self.get("id"))

    @property
    def status(self) -> str:
        """``running``, ``complete``, ``exhausted`` or ``cancelled``."""
        return str(self.get("status"))

    @property
    def counters(self) -> Json:
        return self._obj("counters")


class BatchView(Record):
    """A sampling batch with its accepted groups."""

    @property
    def batch(self) -> Batch:
        return Batch(self._obj("batch"))

    @property
    def groups(self) -> List[Group]:
        return [Group(g) for g in self.get("groups") or []]

    @property
    def duplicate(self) -> bool:
        return bool(self.get("duplicate"))
