"""Gymnasium ids for sb3-contrib's invalid-action test envs (``sb3_ppg/InvalidActionEnv*-v0``), for the command line."""

import gymnasium as gym

#: The ids, with sb3-contrib's env and its arguments (those of sb3-contrib's MaskablePPO tests; ``--env-kwargs`` changes them)
INVALID_ACTION_ENVS = {
    # sb3-contrib's performance test (test_identity): 70 actions, 55 of them invalid in each state
    "sb3_ppg/InvalidActionEnvDiscrete-v0": ("InvalidActionEnvDiscrete", dict(dim=70, n_invalid_actions=55)),
    "sb3_ppg/InvalidActionEnvMultiDiscrete-v0": ("InvalidActionEnvMultiDiscrete", dict(dims=[2, 3], n_invalid_actions=1)),
    "sb3_ppg/InvalidActionEnvMultiBinary-v0": ("InvalidActionEnvMultiBinary", dict(dims=3, n_invalid_actions=1)),
}


def register_invalid_action_envs() -> None:
    """
    Register ``sb3_ppg/InvalidActionEnvDiscrete-v0``, ``...MultiDiscrete-v0`` and ``...MultiBinary-v0``: sb3-contrib's
    ``sb3_contrib.common.envs`` identity envs with invalid actions (the state is the right action; reward 1 for it, 100
    steps per episode), whose ``action_masks()`` MaskablePPG reads. Safe to call several times.
    """
    for env_id, (class_name, kwargs) in INVALID_ACTION_ENVS.items():
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=f"sb3_contrib.common.envs:{class_name}", kwargs=kwargs)
