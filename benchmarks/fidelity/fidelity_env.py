"""
A tiny gym3 environment for the fidelity recordings: both reference codebases run on it (the original code through
gym3 as it runs Procgen, CleanRL through ``gym3.ToBaselinesVecEnv``, which is what ``procgen.ProcgenEnv`` returns).

Procgen's own games give almost no episode ends and few rewards in a 16-step rollout, and their 64x64 frames make the
networks (and the recorded weights) large. This env has Procgen's interface (a ``{"rgb": uint8 HxWx3}`` observation,
``Discrete(15)`` actions, float32 rewards, ``first`` flags) with tiny frames, dense rewards (0, 1 or 10) and
episodes of 3 to 11 steps, so that every recorded rollout crosses episode boundaries. It is deterministic given its
seed (the rewards depend on the actions).
"""

import gym3
import numpy as np
from gym3 import types

N_ACTIONS = 15


class FidelityEnv(gym3.Env):
    """
    :param num: number of envs
    :param image_size: frames are ``image_size x image_size x 3`` uint8
    :param seed: seed of the env's own generator
    """

    def __init__(self, num: int, image_size: int = 8, seed: int = 0) -> None:
        frame = types.TensorType(eltype=types.Discrete(256, dtype_name="uint8"), shape=(image_size, image_size, 3))
        super().__init__(
            ob_space=types.DictType(rgb=frame), ac_space=types.TensorType(eltype=types.Discrete(N_ACTIONS), shape=()), num=num
        )
        self.image_size = image_size
        self.rng = np.random.default_rng(seed)
        self.episode_length = self.rng.integers(3, 12, size=num)
        self.elapsed = np.zeros(num, dtype=np.int64)
        self.reward = np.zeros(num, dtype=np.float32)
        self.first = np.ones(num, dtype=bool)
        self.frames = self._new_frames()

    def _new_frames(self) -> np.ndarray:
        return self.rng.integers(0, 256, size=(self.num, self.image_size, self.image_size, 3), dtype=np.uint8)

    def observe(self):
        return self.reward.copy(), {"rgb": self.frames.copy()}, self.first.copy()

    def get_info(self):
        return [{} for _ in range(self.num)]

    def act(self, ac) -> None:
        ac = np.asarray(ac).reshape(self.num)
        # 1 for the action that the frame's first pixel names, plus an action-independent 0, 1 or 10
        target = self.frames[:, 0, 0, 0] % N_ACTIONS
        bonus = self.rng.choice(np.array([0.0, 1.0, 10.0]), size=self.num, p=[0.6, 0.3, 0.1])
        self.reward = ((ac == target) + bonus).astype(np.float32)
        self.elapsed += 1
        done = self.elapsed >= self.episode_length
        self.elapsed[done] = 0
        self.episode_length[done] = self.rng.integers(3, 12, size=int(done.sum()))
        self.first = done
        self.frames = self._new_frames()
