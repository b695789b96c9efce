"""SkyRL adapter: a generator that runs a training step's prompts as episodes of the
rollout service.

SkyRL's trainer asks its generator (``GeneratorInterface``) for a whole batch at once,
``await generator.generate(input_batch)``, and expects one trajectory per prompt, in
the order of the prompts. :class:`RolloutServiceGenerator` turns each prompt and its
``env_extras`` into a task, submits them as one batch, and returns SkyRL's
``GeneratorOutput``: token IDs, loss masks, rollout logprobs, the service's rewards and
SkyRL's stop reasons. Checked against skyrl-train 0.3.1
(``skyrl_train/generators/base.py``); SkyRL 0.4's ``skyrl.train.generators.base`` is
used when installed (its added output fields are optional).

Wire it in an experiment class, as SkyRL's own examples do::

    class RolloutServiceExp(BasePPOExp):
        def get_generator(self, cfg, tokenizer, inference_engine_client):
            return RolloutServiceGenerator(gateway="http://rollout-gateway:7878")

Importing this module does not import SkyRL; the class is made from SkyRL's
``GeneratorInterface`` when first looked up.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .. import RolloutClient, RolloutError, RolloutTimeout
from ..types import JobResult
from . import TRUNCATED, default_task, lazy_class, scored_trajectory, with_trainer_sampling

Json = Dict[str, Any]


def extras_task(prompt: Any, env_extras: Mapping[str, Any]) -> Json:
    """The default task for a SkyRL prompt: ``env_extras["task"]`` (or
    ``env_extras["extra_info"]["task"]``), else the chat prompt graded against
    ``env_extras["reward_spec"]["ground_truth"]``, the shape of SkyRL's GSM8K dataset
    (see :func:`~rollout_client.adapters.default_task`)."""
    spec = env_extras.get("reward_spec")
    truth = spec.get("ground_truth") if isinstance(spec, Mapping) else None
    return default_task(prompt, env_extras, truth)


def stop_reason(finish_reason: Optional[str]) -> str:
    """SkyRL's stop reason for an episode: ``"length"`` when a limit cut it (turns,
    context, a turn's tokens, the wall clock), else ``"stop"``. SkyRL's
    ``zero_reward_on_non_stop`` and overlong filtering act on anything but ``"stop"``."""
    return "length" if finish_reason in TRUNCATED else "stop"


def generator_output(results: Sequence[JobResult]) -> Json:
    """SkyRL's ``GeneratorOutput`` for scored episodes, one row per result in the
    order given. An agent program's episode of several training samples gives its last
    (the one the trajectory's own fields hold). Raises
    :class:`~rollout_client.adapters.EpisodeFailed` for a job that was not scored: a
    batch with a hole in it cannot be trained on."""
    trajectories = [scored_trajectory(r) for r in results]
    return {
        "prompt_token_ids": [t.prompt_ids for t in trajectories],
        "response_ids": [t.response_ids for t in trajectories],
        "rewards": [r.reward for r in results],
        "loss_masks": [t.loss_mask for t in trajectories],
        "stop_reasons": [stop_reason(t.finish_reason) for t in trajectories],
        "rollout_metrics": None,
        "rollout_logprobs": [t.logprobs for t in trajectories],
        # One row per trajectory (not SkyRL's step-wise mode): as SkyRL's own generator.
        "trajectory_ids": None,
        "is_last_step": None,
    }


def batch_tasks(task_fn: Any, input_batch: Mapping[str, Any]) -> List[Json]:
    """The tasks for SkyRL's ``GeneratorInput``, in its order: ``task_fn(prompt,
    env_extras)`` with SkyRL's sampling settings as defaults; each trajectory's
    ``instance_id`` (the prompt, shared by its GRPO samples) is the task's
    ``group_id``, so one prompt's samples share a backend and its prefix cache."""
    prompts = input_batch["prompts"]
    extras = input_batch.get("env_extras") or [{} for _ in prompts]
    ids = input_batch.get("trajectory_ids")
    sampling = input_batch.get("sampling_params") or {}
    tasks = []
    for i, (prompt, extra) in enumerate(zip(prompts, extras)):
        task = with_trainer_sampling(task_fn(prompt, extra or {}), sampling)
        if ids:
            task.setdefault("group_id", str(ids[i].instance_id))
        tasks.append(task)
    return tasks


def _generator_interface() -> type:
    try:
        from skyrl.train.generators.base import GeneratorInterface  # SkyRL 0.4 and later
    except ImportError:
        from skyrl_train.generators.base import GeneratorInterface  # skyrl-train 0.3
    return GeneratorInterface


def _generator_class() -> type:
    from . import load_function

    class RolloutServiceGenerator(_generator_interface()):  # type: ignore[misc]
        """SkyRL's generator backed by the rollout service (see the module's doc).

        ``gateway``, ``token``: the gateway's URL and bearer token (default
        ``$ROLLOUT_GATEWAY``, ``$ROLLOUT_GATEWAY_TOKEN``); ``task_fn``: a function, or
        its dotted path, from ``(prompt, env_extras)`` to a task (default
        :func:`extras_task`); ``timeout``: seconds for a whole batch."""

        def __init__(
            self,
            gateway: Optional[str] = None,
            token: Optional[str] = None,
            task_fn: Any = None,
            timeout: Optional[float] = None,
        ):
            self.client = RolloutClient(gateway, token)
            self.task_fn = load_function(task_fn) or extras_task
            self.timeout = timeout

        async def generate(self, input_batch: Any) -> Any:
            """One trajectory per prompt, in the prompts' order (the service's
            ``run`` returns results in task order, whatever order they end in). A
            batch that outlives ``timeout``, or whose caller gives up on it, is
            cancelled on the service."""
            tasks = batch_tasks(self.task_fn, input_batch)
            batch_id = f"skyrl-{uuid.uuid4().hex[:12]}"
            try:
                results = await asyncio.to_thread(self.client.run, tasks, batch_id, self.timeout)
            except (RolloutTimeout, asyncio.CancelledError):
                await asyncio.shield(asyncio.to_thread(self._cancel_quietly, batch_id))
                raise
            return generator_output(results)

        def _cancel_quietly(self, batch_id: str) -> None:
            try:
                self.client.cancel(batch_id)
            except RolloutError:
                pass  # it ended meanwhile (409), or the gateway is gone: nothing to stop

    return RolloutServiceGenerator


# The class derives from the trainer's base class, so it is made (importing the trainer)
# when first looked up.
__getattr__ = lazy_class(__name__, "RolloutServiceGenerator", _generator_class)
