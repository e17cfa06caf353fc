"""
The VecEnvs of the command line: Procgen ids run on the native :class:`~sb3_ppg.procgen.ProcgenVecEnv`
(:class:`ProcgenVecEnvFactory`, which the zoo's experiment manager calls in place of a VecEnv class), every other env
on the zoo's usual ``DummyVecEnv`` / ``SubprocVecEnv``. Nothing here imports the zoo.
"""

import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv

from sb3_ppg.common.preprocessing import check_first_observation, check_observation_space
from sb3_ppg.procgen import ProcgenGymnasiumEnv
from sb3_ppg.procgen.wrappers import make_monitored_procgen_env


def is_procgen_env_id(env_id: str) -> bool:
    """
    Whether a gymnasium id is one of sb3_ppg's Procgen ids (``procgen/<game>-v0``, see
    :func:`sb3_ppg.procgen.register_procgen_envs`).

    :param env_id: Gymnasium environment id
    :return: True for a Procgen id
    """
    if env_id not in gym.envs.registry:
        return env_id.startswith("procgen/")
    spec = gym.spec(env_id)
    return spec.namespace == "procgen" or "sb3_ppg.procgen" in str(spec.entry_point)


class ProcgenVecEnvFactory:
    """
    Stands in for a ``VecEnv`` class in the zoo (``ExperimentManager.default_vec_env_cls``), which calls it as
    ``factory(env_fns, **vec_env_kwargs)`` with one env constructor per environment (each wrapped in ``Monitor``).

    For a Procgen env it builds ``env_fns[0]()`` once to read the game and its options (so ``env_kwargs`` and
    ``--env-kwargs`` / ``--eval-env-kwargs`` still apply), closes it, and returns one native
    ``ProcgenVecEnv(len(env_fns), game, **options)`` wrapped in ``VecMonitor``: the first layers of
    :func:`~sb3_ppg.procgen.make_procgen_env`'s chain (:func:`~sb3_ppg.procgen.wrappers.make_monitored_procgen_env`),
    the zoo adding the reward normalization (``normalize``) and the channel transpose itself. The ``VecMonitor``
    writes to the probe's monitor file (``<log dir>/0.monitor.csv``, one file for all envs) when the zoo logs the
    training env. All games then run in one C++ env, stepped by procgen's worker threads, as many as torch's threads
    (which the command line chooses: ``--num-threads``, ``OMP_NUM_THREADS`` or :mod:`sb3_ppg.common.threads`).

    Any other env (and a Procgen env with extra gymnasium wrappers from ``env_wrapper``) is built with the fallback
    ``VecEnv`` class, after its observation space and first observation are checked on the probe (see
    :func:`~sb3_ppg.common.preprocessing.check_observation_space` and
    :func:`~sb3_ppg.common.preprocessing.check_first_observation`): a space SB3's VecEnvs cannot hold, or observations
    their cast would change, is a ``ValueError`` before any VecEnv is built.

    :param fallback_vec_env_cls: ``VecEnv`` class for non-Procgen envs. None: ``DummyVecEnv`` for one env,
        ``SubprocVecEnv`` for several (what ``rl_zoo3.utils.create_test_env`` does by default)
    """

    def __init__(self, fallback_vec_env_cls: type[VecEnv] | None = None) -> None:
        self.fallback_vec_env_cls = fallback_vec_env_cls

    def _fallback(self, env_fns: list[Callable[[], gym.Env]], **vec_env_kwargs: Any) -> VecEnv:
        """
        :param env_fns: Env constructors
        :param vec_env_kwargs: Keyword arguments of the ``VecEnv`` class
        :return: The env built with the fallback class
        """
        vec_env_cls = self.fallback_vec_env_cls
        if vec_env_cls is None:
            vec_env_cls = SubprocVecEnv if len(env_fns) > 1 else DummyVecEnv
        return vec_env_cls(env_fns, **vec_env_kwargs)

    def __call__(self, env_fns: list[Callable[[], gym.Env]], **vec_env_kwargs: Any) -> VecEnv:
        """
        :param env_fns: Env constructors, as given by ``make_vec_env``
        :param vec_env_kwargs: Keyword arguments of the ``VecEnv`` class (only used by the fallback)
        :return: The vectorized env
        """
        probe = env_fns[0]()
        if not isinstance(probe.unwrapped, ProcgenGymnasiumEnv):
            try:
                # Before the VecEnv: SB3's fails on a Graph, Sequence or Text space, and casts observations silently
                check_observation_space(probe.observation_space)
                check_first_observation(probe)
            finally:
                probe.close()
            return self._fallback(env_fns, **vec_env_kwargs)

        monitor = None
        extra_wrappers = []
        env = probe
        while isinstance(env, gym.Wrapper):
            if isinstance(env, Monitor):
                monitor = env
            elif not isinstance(env, (gym.wrappers.OrderEnforcing, gym.wrappers.PassiveEnvChecker)):
                extra_wrappers.append(type(env).__name__)
            env = env.env
        if extra_wrappers:
            probe.close()
            warnings.warn(
                f"Procgen env wrapped in {', '.join(extra_wrappers)}: using single envs in a DummyVecEnv "
                "instead of the native ProcgenVecEnv"
            )
            return DummyVecEnv(env_fns)

        procgen_env: ProcgenGymnasiumEnv = probe.unwrapped  # type: ignore[assignment]
        env_name = procgen_env.env_name
        procgen_kwargs = dict(procgen_env.procgen_kwargs)
        if getattr(procgen_env, "render_mode", None) is not None:
            procgen_kwargs.setdefault("render_mode", procgen_env.render_mode)
        # The command line's choice of threads (--num-threads, OMP_NUM_THREADS or the rule of sb3_ppg.common.threads)
        procgen_kwargs.setdefault("num_threads", torch.get_num_threads())
        filename = None
        info_keywords: tuple[str, ...] = ()
        append = False
        if monitor is not None:
            info_keywords = tuple(monitor.info_keywords)
            if monitor.results_writer is not None:
                filename = monitor.results_writer.file_handler.name
                # A resumed run's log is appended to (Monitor(override_existing=False))
                append = "a" in monitor.results_writer.file_handler.mode
        probe.close()

        return make_monitored_procgen_env(
            len(env_fns),
            env_name,
            monitor_filename=filename,
            monitor_info_keywords=info_keywords,
            monitor_override_existing=not append,
            **procgen_kwargs,
        )
