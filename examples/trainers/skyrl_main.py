"""SkyRL: the rollout service as the generator (rollout_client.adapters.skyrl).

SkyRL asks its generator for a step's whole batch; the adapter submits it to the
service, which runs and grades every episode, and returns the trajectories in the
prompts' order. This is SkyRL's entry point with that one method changed, run as
SkyRL's own examples are:

    python3 -m examples.trainers.skyrl_main data.train_data="['tasks.parquet']" ...

Each row's `env_extras` say which task to run: `task` (or `extra_info.task`) holding a
task of examples/agent.jsonl's shape; a row of SkyRL's GSM8K shape
(`reward_spec.ground_truth`) needs none: its prompt is graded by the math grader. The
service's backends must be the inference servers SkyRL updates. For SkyRL 0.4 and
later, import the same names from `skyrl.train.entrypoints.main_base` and
`skyrl.train.utils`.
"""

import hydra
import ray
from omegaconf import DictConfig
from skyrl_train.entrypoints.main_base import BasePPOExp, config_dir, validate_cfg
from skyrl_train.utils import initialize_ray

from rollout_client.adapters.skyrl import RolloutServiceGenerator


class RolloutServiceExp(BasePPOExp):
    def get_generator(self, cfg, tokenizer, inference_engine_client):
        # gateway defaults to $ROLLOUT_GATEWAY, the token to $ROLLOUT_GATEWAY_TOKEN;
        # task_fn="my_project.tasks.to_task" maps (prompt, env_extras) to a task.
        return RolloutServiceGenerator(gateway="http://127.0.0.1:7878", timeout=3600)


@ray.remote(num_cpus=1)
def skyrl_entrypoint(cfg: DictConfig):
    # As in SkyRL's examples: the training loop does not run on the head node.
    RolloutServiceExp(cfg).run()


@hydra.main(config_path=config_dir, config_name="ppo_base_config", version_base=None)
def main(cfg: DictConfig) -> None:
    validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(skyrl_entrypoint.remote(cfg))


if __name__ == "__main__":
    main()
