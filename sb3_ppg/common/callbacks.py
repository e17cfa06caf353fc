"""
Callbacks told of rollout boundaries (:class:`RolloutBoundaryCallback`, the protocol ``PPG.collect_rollouts()``
follows) and ``PPGEvalCallback`` (SB3's ``EvalCallback``, evaluating without disturbing training's random generators
and continuing its evaluation log after a resume). ``PPGCheckpointCallback`` is in :mod:`sb3_ppg.common.checkpoints`.
"""

import os
import pathlib
import random
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, EvalCallback, EventCallback

from sb3_ppg.common import distributed
from sb3_ppg.common.array_files import fsync_directory


class RolloutBoundaryCallback(BaseCallback):
    """
    A callback that is told of rollout boundaries: ``PPG.collect_rollouts()`` calls :meth:`on_rollout_boundary` of
    every such callback (nested ones included) before a rollout draws anything, once ``train()`` has consumed the
    previous rollout. Under torchrun, every rank must be given the same ones (``learn()`` checks their settings).
    """

    def on_rollout_boundary(self) -> None:
        """Called at a rollout boundary (see the class docstring)."""


def iter_callbacks(callback: BaseCallback | None) -> Iterator[BaseCallback]:
    """The callback and every callback nested in it (``CallbackList``, ``EventCallback``)."""
    if callback is None:
        return
    yield callback
    if isinstance(callback, CallbackList):
        for child in callback.callbacks:
            yield from iter_callbacks(child)
    if isinstance(callback, EventCallback):
        yield from iter_callbacks(callback.callback)


def rollout_boundary_callbacks(callback: BaseCallback | None) -> list[RolloutBoundaryCallback]:
    """The :class:`RolloutBoundaryCallback` s in ``callback`` (itself, or nested in it)."""
    return [child for child in iter_callbacks(callback) if isinstance(child, RolloutBoundaryCallback)]


def env_step_calls(model: BaseAlgorithm) -> int:
    """
    The calls to ``env.step()`` this process has made since the run's start, from ``model.num_timesteps`` (which
    counts the env steps of all ranks under torchrun): what callbacks count their frequencies in, so that a resumed
    run saves and evaluates at the same steps as an uninterrupted one.

    :param model: The model being trained
    :return: The number of calls
    """
    return model.num_timesteps // (model.n_envs * distributed.get_world_size())


class PPGEvalCallback(EvalCallback):
    """
    SB3's ``EvalCallback`` (same arguments) for runs that are checkpointed and resumed: an evaluation draws from its
    own random streams (training's torch, numpy and Python generators are saved before it and put back after it), it
    happens every ``eval_freq`` calls counted from the run's start (``model.num_timesteps``), a resumed run keeps the
    evaluations of ``<log_path>/evaluations.npz`` up to its ``num_timesteps`` (a log that cannot be read is moved
    aside to ``evaluations.npz.damaged``, with a warning), and the log is replaced atomically. So a run trains exactly
    as it would without evaluations, and a resumed run evaluates at the same steps as an uninterrupted one. The RL Zoo
    command line uses it, with the run's ``--seed``, for every PPG run with ``--eval-freq``.

    :param args: The arguments of SB3's ``EvalCallback``
    :param seed: Seed the evaluation env with ``seed + num_timesteps`` before each evaluation, so that an evaluation
        depends only on the policy and the step; ``None`` (default): as ``EvalCallback``, the evaluation env continues
        from where the previous evaluation left it
    :param kwargs: The keyword arguments of SB3's ``EvalCallback``
    """

    def __init__(self, *args: Any, seed: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.seed = seed

    def _on_training_start(self) -> None:
        super()._on_training_start()
        self.n_calls = env_step_calls(self.model)
        if self.log_path is not None:
            # What a kill during an evaluation may have left
            log_path = pathlib.Path(self.log_path)
            for path in log_path.parent.glob(f".{log_path.name}.npz.tmp-*.npz"):
                path.unlink(missing_ok=True)
        if self.model.num_timesteps > 0 and self.log_path is not None and not self.evaluations_timesteps:
            self._restore_evaluations()

    def _restore_evaluations(self) -> None:
        """
        Keep the evaluations of ``log_path`` done up to the model's ``num_timesteps``; a log that cannot be read is
        moved aside with a warning (the log then starts again).
        """
        path = f"{self.log_path}.npz"
        if not os.path.isfile(path):
            return
        try:
            with np.load(path, allow_pickle=False) as data:
                keep = data["timesteps"] <= self.model.num_timesteps
                timesteps = [int(step) for step in data["timesteps"][keep]]
                results = [list(row) for row in data["results"][keep]]
                lengths = [list(row) for row in data["ep_lengths"][keep]]
                successes = [list(row) for row in data["successes"][keep]] if "successes" in data else []
        except Exception as error:
            os.replace(path, f"{path}.damaged")
            warnings.warn(
                f"The evaluation log {path} cannot be read ({type(error).__name__}: {error}): moved to {path}.damaged; "
                "the log starts again with the next evaluation (the best mean reward so far is unknown: the next "
                "evaluation's model becomes the best model)."
            )
            return
        self.evaluations_timesteps, self.evaluations_results, self.evaluations_length = timesteps, results, lengths
        if successes:
            self.evaluations_successes = successes
        if self.evaluations_results:
            means = [float(np.mean(results)) for results in self.evaluations_results]
            self.best_mean_reward, self.last_mean_reward = max(means), means[-1]

    def _on_step(self) -> bool:
        if not (self.eval_freq > 0 and self.n_calls % self.eval_freq == 0):
            return super()._on_step()
        devices = [self.model.device] if self.model.device.type == "cuda" else []
        if self.seed is not None:
            self.eval_env.seed(self.seed + self.model.num_timesteps)
        numpy_state, python_state = np.random.get_state(), random.getstate()
        with th.random.fork_rng(devices=devices):
            try:
                return self._evaluate()
            finally:
                np.random.set_state(numpy_state)
                random.setstate(python_state)

    def _evaluate(self) -> bool:
        """
        SB3's evaluation (``EvalCallback._on_step``), its log written atomically: SB3 writes it to a temporary file
        in the same folder (its ``log_path`` is pointed there for the call), which is fsynced and renamed over
        ``<log_path>.npz`` once the evaluation has completed (and deleted if it fails).

        :return: Whether training continues
        """
        if self.log_path is None:
            return super()._on_step()
        log_path = pathlib.Path(self.log_path)
        temporary = log_path.with_name(f".{log_path.name}.npz.tmp-{os.getpid()}.npz")
        self.log_path = str(temporary)
        try:
            continue_training = super()._on_step()
            with open(temporary, "rb") as file:
                os.fsync(file.fileno())
            os.replace(temporary, f"{log_path}.npz")
        finally:
            self.log_path = str(log_path)
            temporary.unlink(missing_ok=True)
        fsync_directory(log_path.parent)
        return continue_training
