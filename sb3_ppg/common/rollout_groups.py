"""
Overlapped rollouts: the envs split into groups (:class:`GroupedVecEnv`), and while one group's envs step (Procgen's
C++ threads, which run without the GIL) the network acts on the next group's observations
(:func:`overlapped_forward`, what ``PPG(overlap_rollouts=True)`` uses).
"""

import itertools
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper
from stable_baselines3.common.vec_env.base_vec_env import VecEnvIndices, VecEnvObs, VecEnvStepReturn


def _concatenate(parts: list[Any]) -> Any:
    """Concatenate per-group observations: arrays, or dicts of arrays (Dict spaces)."""
    if isinstance(parts[0], dict):
        return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
    return np.concatenate(parts)


def _chain(parts: Iterable[Iterable[Any]]) -> list[Any]:
    """The items of the groups' lists, in order, in one list."""
    return list(itertools.chain.from_iterable(parts))


class GroupedVecEnv(VecEnv):
    """
    One VecEnv made of several (the groups), their envs in order: env ``i`` of the whole is env ``i - start`` of the
    group that holds it. Stepped as a whole, it is the same as one VecEnv of all those envs; a group can also start its
    step alone (``step_group_async``) as soon as its actions are known, which ``PPG(overlap_rollouts=True)`` does
    while the network acts on the next group.

    :param venvs: the groups, VecEnvs with the same observation and action spaces
    """

    def __init__(self, venvs: Sequence[VecEnv]) -> None:
        if len(venvs) < 2:
            raise ValueError(f"GroupedVecEnv needs at least 2 groups, got {len(venvs)}.")
        first = venvs[0]
        for venv in venvs[1:]:
            if venv.observation_space != first.observation_space or venv.action_space != first.action_space:
                raise ValueError("The groups of a GroupedVecEnv must have the same observation and action spaces.")
        self.venvs = list(venvs)
        starts = np.cumsum([0, *[venv.num_envs for venv in self.venvs]])
        #: (start, stop) of each group's envs in the whole
        self.groups = [(int(start), int(stop)) for start, stop in itertools.pairwise(starts)]
        super().__init__(int(starts[-1]), first.observation_space, first.action_space)
        self.render_mode = first.render_mode
        # The actions of the groups whose step has started (step_group_async), by group
        self._started: dict[int, np.ndarray] = {}

    def step_group_async(self, group: int, actions: np.ndarray) -> None:
        """
        Start the step of one group with its actions; ``step_async`` (with the same actions) and ``step_wait`` end it.

        :param group: the group's index
        :param actions: the actions of its envs
        """
        if group in self._started:
            raise RuntimeError(f"Group {group} of the GroupedVecEnv has started its step already.")
        self.venvs[group].step_async(actions)
        self._started[group] = np.array(actions, copy=True)

    def step_async(self, actions: np.ndarray) -> None:
        for group, (venv, (start, stop)) in enumerate(zip(self.venvs, self.groups, strict=True)):
            started = self._started.get(group)
            if started is None:
                venv.step_async(actions[start:stop])
            elif not np.array_equal(started, actions[start:stop]):
                raise ValueError(
                    f"The actions of envs {start}-{stop - 1} differ from those their step was started with: a VecEnv "
                    "wrapper above the GroupedVecEnv changes the actions, which overlapped rollouts do not support "
                    "(use overlap_rollouts=False)."
                )

    def step_wait(self) -> VecEnvStepReturn:
        results = [venv.step_wait() for venv in self.venvs]
        self._started = {}
        observations, rewards, dones, infos = zip(*results, strict=True)
        return _concatenate(list(observations)), np.concatenate(rewards), np.concatenate(dones), _chain(infos)

    def reset(self) -> VecEnvObs:
        observations = []
        for venv, (start, stop) in zip(self.venvs, self.groups, strict=True):
            if self._seeds[start] is not None:
                venv.seed(self._seeds[start])  # the envs' seeds: seed + their index in the whole
            venv.set_options(self._options[start:stop])
            observations.append(venv.reset())
        self._reset_seeds()
        self._reset_options()
        self.reset_infos = _chain(venv.reset_infos for venv in self.venvs)
        self._started = {}
        return _concatenate(observations)

    def close(self) -> None:
        for venv in self.venvs:
            venv.close()

    def get_images(self) -> Sequence[np.ndarray | None]:
        return _chain(venv.get_images() for venv in self.venvs)

    def _locate(self, indices: VecEnvIndices) -> list[tuple[VecEnv, int]]:
        """The group and the index in it of each env of ``indices``, in order."""
        located = []
        for index in self._get_indices(indices):
            group = next(group for group, (start, stop) in enumerate(self.groups) if start <= index < stop)
            located.append((self.venvs[group], index - self.groups[group][0]))
        return located

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return [venv.get_attr(attr_name, [index])[0] for venv, index in self._locate(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        for venv, index in self._locate(indices):
            venv.set_attr(attr_name, value, [index])

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        located = self._locate(indices)
        return [venv.env_method(method_name, *method_args, indices=[index], **method_kwargs)[0] for venv, index in located]

    def env_is_wrapped(self, wrapper_class: type, indices: VecEnvIndices = None) -> list[bool]:
        return [venv.env_is_wrapped(wrapper_class, [index])[0] for venv, index in self._locate(indices)]

    @property
    def has_env_states(self) -> bool:
        """Whether every group gives its envs' states (``get_env_states``: Procgen's native envs), for checkpoints."""
        return all(hasattr(venv, "get_env_states") for venv in self.venvs)

    def get_env_settings(self) -> dict[str, Any]:
        """The settings of each group's games (``get_env_settings``), for checkpoints."""
        return {"groups": [getattr(venv, "get_env_settings", dict)() for venv in self.venvs]}

    def get_env_states(self) -> list[bytes]:
        """The states of all envs, group by group (every group must give them: ``has_env_states``)."""
        return _chain(venv.get_env_states() for venv in self.venvs)  # type: ignore[attr-defined]

    def set_env_states(self, states: list[bytes]) -> None:
        """Put back the states of ``get_env_states``."""
        if len(states) != self.num_envs:
            raise ValueError(f"{len(states)} saved env states for a GroupedVecEnv of {self.num_envs} envs.")
        for venv, (start, stop) in zip(self.venvs, self.groups, strict=True):
            venv.set_env_states(states[start:stop])  # type: ignore[attr-defined]


def find_grouped_vec_env(venv: VecEnv) -> GroupedVecEnv | None:
    """The ``GroupedVecEnv`` at the bottom of a VecEnv chain, or None."""
    while isinstance(venv, VecEnvWrapper):
        venv = venv.venv
    return venv if isinstance(venv, GroupedVecEnv) else None


def env_actions(actions: np.ndarray, policy: BasePolicy, action_space: spaces.Space) -> np.ndarray:
    """The actions SB3's rollout collection gives the env: Box actions unscaled (squashed policies) or clipped."""
    if isinstance(action_space, spaces.Box):
        if policy.squash_output:
            return policy.unscale_action(actions)
        return np.clip(actions, action_space.low, action_space.high)
    return actions


@contextmanager
def overlapped_forward(policy: BasePolicy, venv: GroupedVecEnv, action_space: spaces.Space) -> Iterator[None]:
    """
    Inside the context, the policy's forward pass on the observations of all envs (the rollout's) runs group by
    group, and starts each group's step as soon as its actions are known, so that the group steps while the network
    acts on the next one. The rollout collection then steps the whole env as usual (``GroupedVecEnv.step_async``
    checks that the actions are those the groups started with), and gets the same results as a collection that samples
    group by group and steps the envs afterwards.

    :param policy: the policy (its ``forward`` returns actions, values and log-probabilities)
    :param venv: the bottom of the model's env chain
    :param action_space: the model's action space
    """
    forward = policy.forward
    patched = "forward" in vars(policy)

    def grouped_forward(obs: Any, *args: Any, action_masks: np.ndarray | None = None, **kwargs: Any) -> Any:
        n_obs = len(next(iter(obs.values())) if isinstance(obs, dict) else obs)
        if n_obs != venv.num_envs:
            return forward(obs, *args, **({"action_masks": action_masks} if action_masks is not None else {}), **kwargs)
        outputs = []
        for group, (start, stop) in enumerate(venv.groups):
            part = slice(start, stop)
            group_obs = {key: value[part] for key, value in obs.items()} if isinstance(obs, dict) else obs[part]
            if action_masks is not None:
                kwargs["action_masks"] = action_masks[part]
            actions, values, log_probs = forward(group_obs, *args, **kwargs)
            venv.step_group_async(group, env_actions(actions.cpu().numpy(), policy, action_space))
            outputs.append((actions, values, log_probs))
        return tuple(th.cat(parts) for parts in zip(*outputs, strict=True))

    policy.forward = grouped_forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        if patched:
            policy.forward = forward  # type: ignore[method-assign]
        else:
            del policy.forward  # the class's forward again
