"""verl adapter: an agent loop that runs each prompt as one episode of the rollout
service.

verl's agent-loop workers (``verl.experimental.agent_loop``) call an agent loop's
``run(sampling_params, **row)`` once per sample and pad what it returns to the
configured ``prompt_length`` and ``response_length``. :class:`RolloutServiceAgentLoop`
turns the row into a task, lets the service run and grade the episode, and returns
verl's ``AgentLoopOutput``: the episode's tokens, its loss mask as ``response_mask``,
its logprobs, and the service's reward as ``reward_score`` (so verl's own reward
step is skipped). Checked against verl 0.9.1 (``verl/experimental/agent_loop/
agent_loop.py``).

Register it in the file that ``actor_rollout_ref.rollout.agent.agent_loop_config_path``
names::

    - name: rollout_service
      _target_: rollout_client.adapters.verl.RolloutServiceAgentLoop
      gateway: http://rollout-gateway:7878   # else $ROLLOUT_GATEWAY
      task_fn: my_project.tasks.row_to_task  # optional: row dict -> task
      timeout: 3600                          # optional: seconds per episode

and pick it with ``actor_rollout_ref.rollout.agent.default_agent_loop=rollout_service``
(or an ``agent_name`` column). Importing this module does not import verl; the class
is made from verl's ``AgentLoopBase`` when first looked up.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Mapping, Optional

from ..types import JobResult, Trajectory
from . import Episodes, default_task, lazy_class, plain, scored_trajectory, with_trainer_sampling

logger = logging.getLogger(__name__)

Json = Dict[str, Any]


def row_task(row: Mapping[str, Any]) -> Json:
    """The default task for a row of verl's dataset (the non-tensor fields its agent
    loop gets): the row's ``task`` or ``extra_info.task``, else ``raw_prompt`` graded
    against ``reward_model.ground_truth`` (see :func:`~rollout_client.adapters.default_task`)."""
    reward_model = row.get("reward_model")
    truth = reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None
    return default_task(row.get("raw_prompt"), row, truth)


def num_turns(traj: Trajectory) -> int:
    """Chat turns as verl counts them: the user's prompt, each model turn and each
    observation (tool result) that followed one."""
    observed = 0
    for turn in traj.turns:
        start, end = turn.get("observation_range") or (0, 0)
        observed += end > start
    return 1 + len(traj.turns) + observed


def agent_loop_output(
    result: JobResult, response_length: int, prompt_length: Optional[int] = None
) -> Json:
    """The fields of verl's ``AgentLoopOutput`` for one scored episode.

    The response, its mask and its logprobs are cut to ``response_length`` together,
    as verl's own agent loops cut theirs (verl pads to that length and cannot hold
    more); the reward stays the episode's and verl puts it on the last token kept. A
    prompt longer than ``prompt_length`` keeps its last ``prompt_length`` tokens, as
    verl's own loops do, with a warning: the service's episode should fit (``limits.
    max_tokens``). ``extra_fields`` name the job and how the episode ended; ``metrics``
    are the time spent generating and in tools (seconds).

    The service bounds an episode's context, not its response, so a response can be
    longer than ``response_length`` when the prompt is short; its reward is then the
    whole episode's, and ``extra_fields["rollout_dropped_tokens"]`` says how many
    response tokens were cut, for a trainer that would rather mask or drop it."""
    traj = scored_trajectory(result)
    prompt = traj.prompt_ids
    if prompt_length is not None and len(prompt) > prompt_length:
        logger.warning(
            "job %s: prompt of %d tokens exceeds rollout.prompt_length=%d; left-truncating",
            result.job_id, len(prompt), prompt_length,
        )
        prompt = prompt[-prompt_length:]
    turns = traj.turns
    return {
        "prompt_ids": prompt,
        "response_ids": traj.response_ids[:response_length],
        "response_mask": traj.loss_mask[:response_length],
        "response_logprobs": traj.logprobs[:response_length],
        "reward_score": result.reward,
        "num_turns": num_turns(traj),
        "metrics": {
            "generate_sequences": sum(t.get("llm_latency_us", 0) for t in turns) / 1e6,
            "tool_calls": sum(t.get("tool_latency_us", 0) for t in turns) / 1e6,
        },
        # turn_scores and tool_rewards: the keys verl's own loops always set.
        "extra_fields": {
            "turn_scores": [],
            "tool_rewards": [],
            "rollout_job_id": result.job_id,
            "rollout_finish_reason": traj.finish_reason,
            "rollout_dropped_tokens": max(0, len(traj.response_ids) - response_length),
        },
    }


async def run_episode(
    episodes: Episodes,
    task_fn: Callable[[Mapping[str, Any]], Json],
    row: Mapping[str, Any],
    sampling_params: Mapping[str, Any],
    prompt_length: int,
    response_length: int,
) -> Json:
    """One sample of verl's agent loop: the row's task, with verl's sampling settings
    as its defaults and its context capped at what verl can hold (``prompt_length +
    response_length``: the service then stops an episode before generating tokens verl
    would drop), run by the service; returns :func:`agent_loop_output`'s fields. The
    row's GRPO ``uid`` becomes the task's ``group_id``, so one prompt's samples share
    a backend and its prefix cache."""
    task = with_trainer_sampling(
        task_fn(row), sampling_params, max_tokens=prompt_length + response_length
    )
    if row.get("uid") is not None:
        task.setdefault("group_id", str(plain(row["uid"])))
    result = await episodes.run(task)
    return agent_loop_output(result, response_length, prompt_length)


def _agent_loop_class() -> type:
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

    from . import load_function, shared_episodes

    class RolloutServiceAgentLoop(AgentLoopBase):  # type: ignore[misc, valid-type]
        """verl's agent loop backed by the rollout service (see the module's doc).

        ``gateway``, ``token``: the gateway's URL and bearer token (default
        ``$ROLLOUT_GATEWAY``, ``$ROLLOUT_GATEWAY_TOKEN``); ``task_fn``: a function, or
        its dotted path, from the row (a dict of the sample's non-tensor fields) to a
        task (default :func:`row_task`); ``timeout``: seconds per episode."""

        def __init__(
            self,
            *args: Any,
            gateway: Optional[str] = None,
            token: Optional[str] = None,
            task_fn: Any = None,
            timeout: Optional[float] = None,
            **kwargs: Any,
        ):
            super().__init__(*args, **kwargs)
            self.gateway, self.token, self.timeout = gateway, token, timeout
            self.task_fn = load_function(task_fn) or row_task

        async def run(self, sampling_params: Dict[str, Any], **kwargs: Any) -> Any:
            fields = await run_episode(
                shared_episodes(self.gateway, self.token, self.timeout),
                self.task_fn,
                kwargs,
                sampling_params,
                self.rollout_config.prompt_length,
                self.rollout_config.response_length,
            )
            return AgentLoopOutput(**fields)

    return RolloutServiceAgentLoop


# The class derives from the trainer's base class, so it is made (importing the trainer)
# when first looked up.
__getattr__ = lazy_class(__name__, "RolloutServiceAgentLoop", _agent_loop_class)
