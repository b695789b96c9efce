"""slime adapter: a custom generate function that runs each sample as one episode of
the rollout service.

slime's default rollout (``slime.rollout.sglang_rollout``) calls the function named by
``--custom-generate-function-path`` as ``await generate(args, sample, sampling_params)``
for every sample and keeps its dynamic-sampling filters, group bookkeeping and data
buffer; a ``Sample`` whose ``reward`` is set is not scored again. :func:`generate`
turns the sample into a task, lets the service run and grade the episode, and fills the
sample: ``tokens`` (prompt and response), ``response_length``, ``loss_mask``,
``rollout_log_probs``, ``reward``, ``status``, ``weight_versions``. Checked against
slime v0.3.1 (``slime/utils/types.py``, ``slime/rollout/sglang_rollout.py``).

    --custom-generate-function-path rollout_client.adapters.slime.generate
    --custom-config-path rollout.yaml

where ``rollout.yaml`` (slime sets each key on ``args``) may hold ``rollout_gateway``
(else ``$ROLLOUT_GATEWAY``), ``rollout_gateway_token``, ``rollout_task_fn`` (the dotted
path of a function from the ``Sample`` to a task; default :func:`sample_task`) and
``rollout_timeout`` (seconds per episode). Leave ``--group-rm`` off: slime's group
reward model scores every group again and would replace the service's rewards. This
module never imports slime: it fills the ``Sample`` it is given.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Mapping, Union

from ..types import JobResult, Trajectory
from . import (
    TRUNCATED,
    default_task,
    load_function,
    scored_trajectory,
    shared_episodes,
    turn_versions,
    with_trainer_sampling,
)

Json = Dict[str, Any]


def sample_task(sample: Any) -> Json:
    """The default task for a slime ``Sample``: ``metadata["task"]`` (the dataset row's
    ``--metadata-key`` field), else the chat ``prompt`` graded against ``label`` (see
    :func:`~rollout_client.adapters.default_task`). A prompt slime already rendered to
    text (``--apply-chat-template``) cannot be sent: the service renders the model's
    template itself."""
    return default_task(sample.prompt, sample.metadata or {}, sample.label)


def status_name(result: JobResult) -> str:
    """The ``Sample.Status`` for a result: ``ABORTED`` for a job cancelled or ended as
    too stale, ``FAILED`` for one that failed or timed out, ``TRUNCATED`` for an
    episode cut at a limit (turns, context, a turn's tokens, the wall clock),
    ``COMPLETED`` otherwise."""
    if result.status in ("cancelled", "stale"):
        return "ABORTED"
    if not result.ok:
        return "FAILED"
    traj = result.trajectory
    return "TRUNCATED" if traj is not None and traj.finish_reason in TRUNCATED else "COMPLETED"


def _fill(sample: Any, traj: Trajectory, status: Any) -> None:
    sample.tokens = traj.prompt_ids + traj.response_ids
    sample.response_length = len(traj.response_ids)
    sample.loss_mask = traj.loss_mask
    sample.rollout_log_probs = traj.logprobs
    # Text for slime's logs; training reads the tokens (observations are in those only).
    sample.response = "".join(t.get("text", "") for t in traj.turns)
    sample.weight_versions = [str(v) for v in turn_versions(traj)]
    sample.status = status


def _note(sample: Any, result: JobResult) -> None:
    """Records the job behind the sample in its metadata (a fresh dict: copies of one
    sample must not share it), for tracing a sample back to the service."""
    traj = result.trajectory
    sample.metadata = {
        **(sample.metadata or {}),
        "rollout": {
            "job_id": result.job_id,
            "status": result.status,
            "finish_reason": traj.finish_reason if traj is not None else None,
            "error": result.error,
        },
    }


def fill_sample(sample: Any, result: JobResult) -> Union[Any, List[Any]]:
    """Fills slime's ``sample`` from the episode's result; returns it, or one copy per
    training sample when the episode has several (an ``agent_program`` whose calls did
    not all continue one conversation), sharing ``rollout_id`` as slime requires of
    samples from one rollout, each with the episode's reward.

    A job that ended without a score comes back ``ABORTED`` or ``FAILED`` with
    ``remove_sample`` set (slime trains nothing on it) and reward 0, so that slime's
    group filters and advantages see a number; its partial tokens, when the service
    kept them, are filled in."""
    status = type(sample).Status[status_name(result)]
    if not result.ok:
        traj = result.trajectory
        if traj is not None:
            _fill(sample, traj, status)
        sample.status = status
        sample.reward = 0.0
        sample.remove_sample = True
        _note(sample, result)
        return sample
    parts = scored_trajectory(result).samples
    copies = [sample] if len(parts) == 1 else [copy.copy(sample) for _ in parts]
    rollout_id = sample.rollout_id if sample.rollout_id is not None else sample.index
    for part, s in zip(parts, copies):
        _fill(s, part, status)
        _note(s, result)
        s.reward = result.reward
        if len(parts) > 1:
            s.rollout_id = rollout_id
    return copies[0] if len(parts) == 1 else copies


async def generate(args: Any, sample: Any, sampling_params: Mapping[str, Any]) -> Any:
    """slime's custom generate function (see the module's doc). slime's sampling
    settings are the task's defaults, its ``rollout_max_context_len`` the episode's
    context limit; the sample's prompt group is the task's ``group_id``, so one
    prompt's samples share a backend and its prefix cache."""
    episodes = shared_episodes(
        getattr(args, "rollout_gateway", None),
        getattr(args, "rollout_gateway_token", None),
        getattr(args, "rollout_timeout", None),
    )
    task_fn = load_function(getattr(args, "rollout_task_fn", None)) or sample_task
    task = with_trainer_sampling(
        task_fn(sample), sampling_params,
        max_tokens=getattr(args, "rollout_max_context_len", None),
    )
    if sample.group_index is not None:
        task.setdefault("group_id", f"slime-{sample.group_index}")
    return fill_sample(sample, await episodes.run(task))
