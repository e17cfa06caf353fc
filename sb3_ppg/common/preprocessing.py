"""
What PPG's policies take as observations and actions: the spaces SB3's buffers and networks support (checked with an
error that names the fix), observations given to ``predict``, and preprocessing that SB3 leaves out.
"""

import warnings
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.preprocessing import is_image_space, maybe_transpose, preprocess_obs
from stable_baselines3.common.type_aliases import PyTorchObs
from stable_baselines3.common.utils import is_vectorized_observation
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.common.vec_env.patch_gym import _patch_env

# The observation spaces that SB3's preprocessing, buffers and features extractors handle (and a Dict of them)
OBSERVATION_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def check_observation_space(observation_space: spaces.Space, key: str | None = None) -> None:
    """
    Refuse, with the space and a fix, an observation space that SB3's buffers and networks cannot take (see docs/ppg.md,
    Can I use?), and a Discrete / MultiDiscrete one whose ``start`` is not 0.

    :param key: the entry's key when ``observation_space`` is inside a Dict space
    """
    where = "" if key is None else f" (key {key!r} of the Dict observation space)"
    if isinstance(observation_space, spaces.Dict) and key is None:
        for sub_key, subspace in observation_space.spaces.items():
            check_observation_space(subspace, sub_key)
        return
    if not isinstance(observation_space, OBSERVATION_SPACES):
        raise ValueError(
            f"PPG does not support the observation space {observation_space}{where}: its policies take Box, Discrete, "
            "MultiDiscrete and MultiBinary observations, or a Dict of those (not nested). Convert the observations "
            "with a gymnasium.ObservationWrapper, e.g. pad a Sequence or Graph into a fixed-shape Box, encode Text as a "
            "MultiDiscrete of character indices, turn a Tuple into a Dict, flatten a nested Dict."
        )
    _check_zero_start(observation_space, f"observation space {observation_space}{where}", "observations")


def check_action_space(action_space: spaces.Space) -> None:
    """Refuse a Discrete / MultiDiscrete action space whose ``start`` is not 0 (SB3 samples actions from 0)."""
    _check_zero_start(action_space, f"action space {action_space}", "actions")


def _check_zero_start(space: spaces.Space, name: str, values: str) -> None:
    """Refuse a Discrete / MultiDiscrete space whose ``start`` is not 0, naming the wrapper that relabels it."""
    if not isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)) or not np.any(getattr(space, "start", 0)):
        return
    if isinstance(space, spaces.MultiDiscrete):
        start, zero_based = space.start.tolist(), f"MultiDiscrete({space.nvec.tolist()})"
        offset = f"np.array({start})"
    else:
        start, zero_based, offset = int(space.start), f"Discrete({int(space.n)})", str(int(space.start))
    if values == "actions":
        problem = "the env would receive actions outside its space"
        fix = (
            f"give the model {zero_based} and add the start in a gymnasium.ActionWrapper, e.g. "
            f"gymnasium.wrappers.TransformAction(env, lambda action: action + {offset}, {zero_based})"
        )
    else:
        problem = "the observations would be one-hot encoded as if they started at 0"
        fix = "subtract the start in a gymnasium.ObservationWrapper (e.g. gymnasium.wrappers.TransformObservation)"
    raise ValueError(
        f"PPG does not support the {name} with start={start}: SB3's networks number the {values} from 0, so {problem}. "
        f"Declare the space with start=0, or {fix}."
    )


def has_integer_box(observation_space: spaces.Space) -> bool:
    """Whether an observation space is (or a Dict holds) a Box of an integer dtype, e.g. ``Box(0, 255, uint8)`` images."""
    if isinstance(observation_space, spaces.Dict):
        return any(has_integer_box(subspace) for subspace in observation_space.spaces.values())
    return isinstance(observation_space, spaces.Box) and np.issubdtype(observation_space.dtype, np.integer)


def check_observation_dtype(observation: Any, observation_space: spaces.Space, key: str | None = None) -> None:
    """
    Refuse an observation of a Box space that SB3's VecEnvs would change when they cast it to the space's dtype (floats
    in [0, 1) in a uint8 space become zeros, out-of-range integers wrap around).

    :param observation: an observation the env returned (one, not a batch), before any VecEnv
    :param key: the entry's key when ``observation_space`` is inside a Dict space
    """
    if isinstance(observation_space, spaces.Dict) and isinstance(observation, dict) and key is None:
        for sub_key, subspace in observation_space.spaces.items():
            if sub_key in observation:
                check_observation_dtype(observation[sub_key], subspace, sub_key)
        return
    if not isinstance(observation_space, spaces.Box) or observation_space.dtype is None:
        return
    try:
        values = np.asarray(observation)
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy's warning for a cast of NaN or inf
            cast = values.astype(observation_space.dtype)
    except (TypeError, ValueError):
        return  # not an array of numbers: SB3's own checks say so
    if values.dtype == observation_space.dtype or values.dtype.kind not in "biuf" or values.size == 0:
        return
    if np.array_equal(cast.astype(values.dtype), values, equal_nan=values.dtype.kind == "f"):
        return
    where = "" if key is None else f" (key {key!r})"
    low, high = np.nanmin(values), np.nanmax(values)
    raise ValueError(
        f"The env's observations{where} are {values.dtype} (values from {low:g} to {high:g}) but its observation space "
        f"{observation_space} is {observation_space.dtype}: SB3's VecEnv casts them to {observation_space.dtype}, which "
        f"changes them (floats in [0, 1) would all become 0). Return {observation_space.dtype} observations within the "
        f"space from the env (e.g. (obs * 255).astype(np.uint8) for images in [0, 1)), or declare the space with the "
        f"observations' dtype and range (e.g. Box(0.0, 1.0, shape, np.float32))."
    )


def check_first_observation(env: Any) -> None:
    """Reset a gymnasium env whose space holds an integer Box and check its observation (:func:`check_observation_dtype`)."""
    if has_integer_box(env.observation_space):
        observation, _ = env.reset()
        check_observation_dtype(observation, env.observation_space)


def checked_env(env: Any) -> Any:
    """
    An env checked as PPG takes it: its spaces, and a gymnasium env's first observation where the space holds an
    integer Box (before ``DummyVecEnv`` casts the observations to the space's dtype); a gym env converted as SB3 does.
    """
    if not isinstance(env, VecEnv):
        env = _patch_env(env)  # a gym (not gymnasium) env, converted as SB3 does, has gymnasium spaces
    check_observation_space(env.observation_space)
    check_action_space(env.action_space)
    if not isinstance(env, VecEnv):
        check_first_observation(env)
    return env


def check_observation_keys(observation: Any, observation_space: spaces.Space) -> None:
    """Check that an observation given to ``predict`` has exactly the keys of a Dict space (and is a dict only for one)."""
    if isinstance(observation_space, spaces.Dict):
        expected = list(observation_space.spaces)
        if not isinstance(observation, dict):
            raise ValueError(
                f"This model takes Dict observations with the keys {expected}, got {type(observation).__name__}: pass a "
                "dict of arrays (one observation, or a batch along the first axis of every array)."
            )
        missing = [key for key in expected if key not in observation]
        extra = [key for key in observation if key not in observation_space.spaces]
        if missing or extra:
            problems = ([f"missing {missing}"] if missing else []) + ([f"unexpected {extra}"] if extra else [])
            raise ValueError(
                f"The observation's keys do not match the model's Dict observation space: {', '.join(problems)}. "
                f"Expected exactly the keys {expected}."
            )
        batch_sizes = {}
        for key, subspace in observation_space.spaces.items():
            # What SB3's obs_to_tensor checks for each key, whose error would not name the key
            value = maybe_transpose(observation[key], subspace) if is_image_space(subspace) else np.array(observation[key])
            try:
                batch_sizes[key] = len(value) if is_vectorized_observation(value, subspace) else None
            except ValueError as error:
                raise ValueError(f"Observation key {key!r}: {error}") from None
        if len(set(batch_sizes.values())) > 1:
            counts = ", ".join(
                f"{key!r}: {'one observation' if size is None else f'a batch of {size}'}" for key, size in batch_sizes.items()
            )
            raise ValueError(
                f"The observation's keys hold different numbers of observations ({counts}): give every key one "
                "observation, or batches of the same size."
            )
    elif isinstance(observation, dict):
        raise ValueError(
            f"This model takes {observation_space} observations, got a dict with the keys {list(observation)}: pass "
            "an array (a Dict observation needs a model trained on a Dict observation space, with MultiInputPolicy)."
        )


def preprocess_obs_as(obs: PyTorchObs, observation_space: spaces.Space, normalize_images: bool, dtype: th.dtype) -> PyTorchObs:
    """
    SB3's ``preprocess_obs`` giving ``dtype``: SB3's own for float32; for another dtype (a float64 policy) Box
    observations are converted before images are divided by 255, so that no float32 rounding enters.
    """
    if dtype == th.float32:
        return preprocess_obs(obs, observation_space, normalize_images=normalize_images)
    if isinstance(observation_space, spaces.Dict):
        assert isinstance(obs, dict)
        return {key: preprocess_obs_as(value, observation_space[key], normalize_images, dtype) for key, value in obs.items()}
    assert isinstance(obs, th.Tensor)
    if isinstance(observation_space, spaces.Box):
        obs = obs.to(dtype)
        return obs / 255.0 if normalize_images and is_image_space(observation_space) else obs
    return preprocess_obs(obs, observation_space, normalize_images=normalize_images).to(dtype)  # type: ignore[union-attr]


def add_scalar_feature_axis(obs: PyTorchObs, observation_space: spaces.Space) -> PyTorchObs:
    """Give preprocessed observations of a Box of shape ``()`` a feature axis, ``(batch,)`` to ``(batch, 1)``."""
    if isinstance(observation_space, spaces.Dict):
        assert isinstance(obs, dict)
        return {key: add_scalar_feature_axis(value, observation_space[key]) for key, value in obs.items()}
    if isinstance(observation_space, spaces.Box) and observation_space.shape == ():
        assert isinstance(obs, th.Tensor)
        return obs.reshape(-1, 1)
    return obs


def check_finite_observations(obs: th.Tensor | dict[str, th.Tensor]) -> None:
    """Refuse observations holding NaN or inf before they reach the networks (integer observations are not looked at)."""
    for key, tensor in obs.items() if isinstance(obs, dict) else [(None, obs)]:
        if tensor.is_floating_point() and not th.isfinite(tensor).all():
            where = f"Observation key {key!r}" if key is not None else "The observation"
            raise ValueError(
                f"{where} holds NaN or inf values: the policy cannot act on them. Check the environment (wrap it in "
                "VecCheckNan(env, raise_exception=True) to find the step that produces them), and scale unbounded "
                "observations (e.g. VecNormalize, which also clips them)."
            )


def env_actions(actions: np.ndarray, policy: BasePolicy, action_space: spaces.Space) -> np.ndarray:
    """The actions SB3's rollout collection gives the env: Box actions unscaled (squashed policies) or clipped."""
    if isinstance(action_space, spaces.Box):
        if policy.squash_output:
            return policy.unscale_action(actions)
        return np.clip(actions, action_space.low, action_space.high)
    return actions
