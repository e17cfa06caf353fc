"""
Procgen presets: the settings of the PPG paper or of CleanRL's ``ppg_procgen.py`` in one word
(``make_procgen_env(..., preset="paper")``, ``get_procgen_preset("paper").ppg_kwargs(n_envs)``; see docs/procgen.md).
The packaged zoo files hold the same settings (``tests/test_procgen_presets.py``).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class ProcgenPreset:
    """
    One published Procgen setting: the env's arguments and PPG's.

    :param algorithm_kwargs: Arguments of ``PPG`` that do not depend on the number of envs
    :param n_envs: Envs of the reference runs, all processes together
    :param total_timesteps: Budget of the reference runs, in env steps
    :param zoo_file: The packaged zoo hyperparameter file with the same settings
    """

    name: str
    description: str
    env_kwargs: Mapping[str, Any]
    algorithm_kwargs: Mapping[str, Any]
    n_envs: int
    total_timesteps: int
    zoo_file: str

    def ppg_kwargs(self, n_envs: int) -> dict[str, Any]:
        """
        ``PPG`` keyword arguments for ``n_envs`` envs per process: ``aux_batch_rollouts = n_envs // 16`` as both references
        (docs/procgen.md), 8 policy minibatches per epoch; a new dict.
        """
        if n_envs < 1:
            raise ValueError(f"n_envs must be >= 1, got {n_envs}")
        kwargs = {key: dict(value) if isinstance(value, Mapping) else value for key, value in self.algorithm_kwargs.items()}
        return dict(kwargs, batch_size=None, aux_batch_rollouts=max(1, n_envs // 16))


_COMMON_ALGORITHM_KWARGS = dict(
    learning_rate=5e-4,
    n_steps=256,
    n_epochs=1,
    gamma=0.999,
    gae_lambda=0.95,
    clip_range=0.2,
    normalize_advantage="batch",
    ent_coef=0.01,
    n_policy_iters=32,
    n_aux_epochs=6,
    beta_clone=1.0,
    vf_true_coef=1.0,
)


def _env_kwargs(distribution_mode: str, reward_gamma: float | None) -> Mapping[str, Any]:
    """
    A preset's ``make_procgen_env`` arguments: all levels; with a ``reward_gamma``, rewards normalized by the env
    (``VecNormalize``, per step) and clipped at 10; ``None``: raw rewards (PPG normalizes them per rollout).
    """
    kwargs: dict[str, Any] = dict(distribution_mode=distribution_mode, num_levels=0, start_level=0)
    if reward_gamma is None:
        kwargs.update(normalize_reward=False)
    else:
        kwargs.update(normalize_reward=True, reward_gamma=reward_gamma, clip_reward=10.0)
    return MappingProxyType(kwargs)


def _algorithm_kwargs(
    policy_minibatches: str,
    clip_range_vf: float | None,
    value_clipping: str,
    vf_coef: float,
    max_grad_norm: float | None,
    separate_aux_optimizer: bool,
    arch: str,
    reward_gamma: float | None = None,
) -> Mapping[str, Any]:
    """
    A preset's PPG arguments: the common ones and those where the paper's code and CleanRL differ; with a
    ``reward_gamma``, PPG's own per-rollout reward normalization (the paper's code), clipped at 10.
    """
    policy_kwargs = dict(arch=arch, detach_value_in_aux=True) if arch == "detach" else dict(arch=arch)
    reward_normalization: dict[str, Any] = {}
    if reward_gamma is not None:
        reward_normalization = dict(
            normalize_reward=True, reward_normalizer_kwargs=MappingProxyType(dict(gamma=reward_gamma, clip_reward=10.0))
        )
    return MappingProxyType(
        dict(
            _COMMON_ALGORITHM_KWARGS,
            policy_minibatches=policy_minibatches,
            clip_range_vf=clip_range_vf,
            value_clipping=value_clipping,
            vf_coef=vf_coef,
            max_grad_norm=max_grad_norm,
            separate_aux_optimizer=separate_aux_optimizer,
            policy_kwargs=MappingProxyType(policy_kwargs),
            **reward_normalization,
        )
    )


#: The presets by name (read-only)
PROCGEN_PRESETS: Mapping[str, ProcgenPreset] = MappingProxyType(
    {
        "paper": ProcgenPreset(
            name="paper",
            description=(
                "The PPG paper (Cobbe et al. 2021, openai/phasic-policy-gradient train.py): hard mode, each rollout's "
                "rewards scaled by PPG (normalize_reward) as the original RewardNormalizer does, by the std of a "
                "0.99-discounted return (its default) while the RL discount is 0.999, separate policy and value "
                "networks, policy-phase minibatches of whole env rollouts, no gradient or value clipping, a separate "
                "Adam for the auxiliary phase; 4 workers x 64 envs, 100M steps. Its "
                "updates and its runs match the original code's to float64 precision (tests/test_fidelity.py, "
                "tests/test_trajectory_fidelity.py, docs/fidelity.md)"
            ),
            env_kwargs=_env_kwargs(distribution_mode="hard", reward_gamma=None),
            algorithm_kwargs=_algorithm_kwargs(
                policy_minibatches="envs",
                clip_range_vf=None,
                value_clipping="sb3",
                vf_coef=0.5,
                max_grad_norm=None,
                separate_aux_optimizer=True,
                arch="dual",
                reward_gamma=0.99,
            ),
            n_envs=256,
            total_timesteps=100_000_000,
            zoo_file="ppg.yml",
        ),
        "cleanrl": ProcgenPreset(
            name="cleanrl",
            description=(
                "CleanRL's ppg_procgen.py: easy mode, rewards scaled by the std of a 0.999-discounted return, one IMPALA "
                "trunk with the value head on detached features, policy-phase minibatches of shuffled transitions, "
                "gradient clipping 0.5, CleanRL's value clipping (the larger of the clipped and unclipped squared "
                "errors, clip 0.2, weight 0.25), one Adam for both phases; 64 envs, 25M steps. Its updates match "
                "CleanRL's to float64 precision but for CleanRL's Bessel-corrected advantage std and its policy "
                "gradient left in the first auxiliary step (docs/fidelity.md)"
            ),
            env_kwargs=_env_kwargs(distribution_mode="easy", reward_gamma=0.999),
            algorithm_kwargs=_algorithm_kwargs(
                policy_minibatches="transitions",
                clip_range_vf=0.2,
                value_clipping="max",
                vf_coef=0.25,
                max_grad_norm=0.5,
                separate_aux_optimizer=False,
                arch="detach",
            ),
            n_envs=64,
            total_timesteps=25_000_000,
            zoo_file="ppg_easy.yml",
        ),
    }
)

#: Other names: the command line's ``--preset easy`` is CleanRL's setting
PRESET_ALIASES: Mapping[str, str] = MappingProxyType({"easy": "cleanrl"})


def get_procgen_preset(name: str) -> ProcgenPreset:
    """
    :param name: ``"paper"`` or ``"cleanrl"`` (``"easy"`` is an alias of ``"cleanrl"``, as on the command line)
    :return: The preset
    """
    preset = PROCGEN_PRESETS.get(PRESET_ALIASES.get(name, name))
    if preset is None:
        choices = ", ".join(repr(key) for key in [*PROCGEN_PRESETS, *PRESET_ALIASES])
        raise ValueError(f"Unknown Procgen preset {name!r}: choose one of {choices}.")
    return preset
