"""
:func:`make_procgen_env`: the PPG paper's wrapper chain over :class:`~sb3_ppg.procgen.ProcgenVecEnv` (episode
statistics, return-based reward normalization, channel-first images), for training and evaluation.
"""

import os
from typing import Any

import numpy as np
from stable_baselines3.common.monitor import ResultsWriter
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import VecEnv, VecMonitor, VecNormalize, unwrap_vec_normalize

from sb3_ppg.common.array_files import read_array_file, write_array_file
from sb3_ppg.procgen.games import check_argument_names
from sb3_ppg.procgen.presets import get_procgen_preset
from sb3_ppg.procgen.vec_env import ProcgenVecEnv

NUMBER_OF_GAMES = "pass the number of games as n_envs"


#: Arguments removed from :func:`make_procgen_env` and :func:`make_monitored_procgen_env`, each with what replaced it
REMOVED_ARGUMENTS = {
    "n_groups": (
        "env groups were removed with PPG's overlap_rollouts, which was measured not to pay (docs/throughput.md); "
        "nothing replaces them: leave the argument out"
    ),
}
#: Names that :func:`make_procgen_env` refuses in ``procgen_kwargs``: what it sets itself, under another API's name, and
#: the removed arguments
MAKE_PROCGEN_ENV_OTHER_NAMES = {
    "rand_seed": "procgen's name for the seed of the level sampler, which make_procgen_env() sets itself: pass seed= instead",
    "num_envs": NUMBER_OF_GAMES,
    "num": NUMBER_OF_GAMES,
    "channels_first": (
        "make_procgen_env() always gives channel-first (3, 64, 64) observations; build "
        "ProcgenVecEnv(n_envs, env_name, channels_first=False) for procgen's (64, 64, 3) frames"
    ),
    **REMOVED_ARGUMENTS,
}
#: What :func:`make_procgen_env` uses without a preset for the arguments left out
DEFAULT_ENV_KWARGS: dict[str, Any] = dict(
    distribution_mode="easy", num_levels=0, start_level=0, reward_gamma=0.999, clip_reward=10.0
)


def make_monitored_procgen_env(
    n_envs: int,
    env_name: str,
    monitor_filename: str | None = None,
    monitor_info_keywords: tuple[str, ...] = (),
    monitor_override_existing: bool = True,
    **vec_env_kwargs: Any,
) -> VecMonitor:
    """
    ``VecMonitor(ProcgenVecEnv(n_envs, env_name, **vec_env_kwargs))``: the first two layers of
    :func:`make_procgen_env`, also built by the RL Zoo's Procgen env factory (:mod:`sb3_ppg.cli.zoo`), where the zoo adds
    the reward normalization itself.

    :param n_envs: Number of parallel games
    :param env_name: Name of the game, one of ``PROCGEN_GAMES``
    :param monitor_filename: Path of the ``VecMonitor`` CSV log (``.monitor.csv`` is appended unless present; its
        folder is created; ``None``: no file)
    :param monitor_info_keywords: Info keys logged by ``VecMonitor`` at episode ends (e.g. ``("is_success",)``)
    :param monitor_override_existing: False: append to an existing log (a resumed run) instead of starting it anew
    :param vec_env_kwargs: Arguments of :class:`~sb3_ppg.procgen.ProcgenVecEnv`
    :return: The monitored env
    """
    other_names = {"num_envs": NUMBER_OF_GAMES, "num": NUMBER_OF_GAMES, **REMOVED_ARGUMENTS}
    check_argument_names("make_monitored_procgen_env()", vec_env_kwargs, other_names)
    venv = ProcgenVecEnv(n_envs, env_name, **vec_env_kwargs)
    if monitor_filename is not None:
        directory = os.path.dirname(monitor_filename)
        if directory:
            os.makedirs(directory, exist_ok=True)
    if monitor_filename is None or monitor_override_existing:
        return VecMonitor(venv, filename=monitor_filename, info_keywords=monitor_info_keywords)
    monitor = VecMonitor(venv, info_keywords=monitor_info_keywords)
    monitor.results_writer = ResultsWriter(monitor_filename, extra_keys=monitor_info_keywords, override_existing=False)
    return monitor


def make_procgen_env(
    env_name: str,
    n_envs: int = 64,
    distribution_mode: str | None = None,
    num_levels: int | None = None,
    start_level: int | None = None,
    seed: int | None = None,
    normalize_reward: bool = True,
    reward_gamma: float | None = None,
    clip_reward: float | None = None,
    training: bool = True,
    num_threads: int | None = None,
    render_mode: str | None = None,
    monitor_filename: str | None = None,
    monitor_info_keywords: tuple[str, ...] = (),
    vec_normalize_path: str | None = None,
    preset: str | None = None,
    **procgen_kwargs: Any,
) -> VecNormalize:
    """
    Procgen env with the PPG paper's wrappers: ``VecNormalize(VecMonitor(ProcgenVecEnv), norm_obs=False)`` over a
    channel-first ``ProcgenVecEnv`` (``VecMonitor`` logs the raw rewards; ``VecNormalize`` scales the rewards by the
    running standard deviation of the discounted return). The chain, the reward-normalization gamma and the presets are
    explained in docs/procgen.md.

    :param env_name: Name of the game, one of ``PROCGEN_GAMES``
    :param n_envs: Number of parallel games (the paper uses 64 per process, 4 processes)
    :param distribution_mode: Level difficulty; default: the preset's, else "easy" ("hard": the paper's results)
    :param num_levels: Number of unique levels (0, the default: unlimited, the paper's setting)
    :param start_level: Seed of the first level (default 0)
    :param seed: Seed of the level sampler (mapped into procgen's range); ``None`` for a random one
    :param normalize_reward: Whether to normalize the rewards (training envs only)
    :param reward_gamma: Discount of the running return used to scale the rewards (default: the preset's, else 0.999)
    :param clip_reward: Normalized rewards are clipped to ``[-clip_reward, clip_reward]`` (default 10)
    :param training: ``False`` for an evaluation env (frozen statistics, raw rewards)
    :param num_threads: Number of procgen worker threads; ``None``: this process's share of the idle CPUs
        (:func:`sb3_ppg.common.threads.default_num_threads`)
    :param render_mode: ``"rgb_array"`` for videos (``VecVideoRecorder``)
    :param monitor_filename: Path of the ``VecMonitor`` CSV log (``.monitor.csv`` is appended unless present; its
        folder is created; ``None``: no file)
    :param monitor_info_keywords: Info keys logged by ``VecMonitor`` at episode ends (e.g. ``("is_success",)``)
    :param monitor_override_existing: False: append to an existing log (a resumed run) instead of starting it anew
    :param vec_normalize_path: Load reward statistics saved with :func:`save_reward_statistics` (plain arrays; any other
        file, a pickled ``VecNormalize`` included, is a ``ValueError``)
    :param preset: ``"paper"`` or ``"cleanrl"`` (``"easy"``): the defaults of ``distribution_mode``, ``num_levels``,
        ``start_level``, ``reward_gamma`` and ``clip_reward`` (:data:`sb3_ppg.procgen.presets.PROCGEN_PRESETS`);
        ``None``: the defaults above
    :param procgen_kwargs: Other procgen options (see :class:`~sb3_ppg.procgen.ProcgenVecEnv`)
    :return: The wrapped env
    """
    check_argument_names("make_procgen_env()", procgen_kwargs, MAKE_PROCGEN_ENV_OTHER_NAMES)
    settings = dict(DEFAULT_ENV_KWARGS if preset is None else get_procgen_preset(preset).env_kwargs)
    explicit = dict(
        distribution_mode=distribution_mode,
        num_levels=num_levels,
        start_level=start_level,
        reward_gamma=reward_gamma,
        clip_reward=clip_reward,
    )
    settings.update({key: value for key, value in explicit.items() if value is not None})
    distribution_mode, num_levels, start_level = settings["distribution_mode"], settings["num_levels"], settings["start_level"]
    reward_gamma, clip_reward = settings["reward_gamma"], settings["clip_reward"]
    if not 0.0 <= reward_gamma < 1.0:
        raise ValueError(f"reward_gamma must be in [0, 1), got {reward_gamma}")
    if not clip_reward > 0.0:
        raise ValueError(f"clip_reward must be positive, got {clip_reward}")
    # Read first: a bad file must not leave a procgen env behind
    reward_statistics = None if vec_normalize_path is None else _load_reward_statistics(vec_normalize_path)
    venv = make_monitored_procgen_env(
        n_envs,
        env_name,
        monitor_filename=monitor_filename,
        monitor_info_keywords=monitor_info_keywords,
        distribution_mode=distribution_mode,
        num_levels=num_levels,
        start_level=start_level,
        rand_seed=seed,
        num_threads=num_threads,
        render_mode=render_mode,
        channels_first=True,
        **procgen_kwargs,
    )
    vec_normalize = VecNormalize(
        venv,
        training=training,
        norm_obs=False,
        norm_reward=normalize_reward and training,
        clip_reward=clip_reward,
        gamma=reward_gamma,
        epsilon=1e-8,
    )
    if reward_statistics is not None:
        vec_normalize.ret_rms, vec_normalize.epsilon = reward_statistics
    return vec_normalize


REWARD_STATISTICS_FORMAT = "sb3_ppg.reward_statistics"


def save_reward_statistics(env: VecEnv, path: str) -> None:
    """
    Save the reward-normalization statistics of a Procgen chain (its ``VecNormalize``) as plain arrays (an ``.npz``
    with checksums, no pickle), for ``make_procgen_env(vec_normalize_path=path)``. The file is written atomically.

    :param env: A chain made by ``make_procgen_env`` (or any VecEnv with a reward-only ``VecNormalize``)
    :param path: The file to write (``.npz`` is the usual suffix)
    """
    vec_normalize = unwrap_vec_normalize(env)
    if vec_normalize is None:
        raise ValueError("The env has no VecNormalize: there are no reward statistics to save.")
    if vec_normalize.norm_obs:
        raise ValueError("This VecNormalize normalizes observations, procgen chains only normalize rewards.")
    rms = vec_normalize.ret_rms
    arrays = {"mean": np.asarray(rms.mean, dtype=np.float64), "var": np.asarray(rms.var, dtype=np.float64)}
    metadata = {"format": REWARD_STATISTICS_FORMAT, "count": float(rms.count), "epsilon": float(vec_normalize.epsilon)}
    write_array_file(path, arrays, metadata)


def _load_reward_statistics(path: str) -> tuple[RunningMeanStd, float]:
    """
    Read reward statistics saved by :func:`save_reward_statistics` (plain arrays, checked against their checksums;
    nothing is unpickled, so a pickled ``VecNormalize`` is refused with a message that says how to convert it).

    :param path: Path of the statistics file
    :return: The running statistics of the discounted returns, and ``epsilon``
    """
    try:
        metadata, arrays = read_array_file(path, REWARD_STATISTICS_FORMAT)
    except OSError as error:
        raise ValueError(f"Could not read reward statistics from {path}: {error!r}") from error
    except ValueError as error:
        raise ValueError(
            f"Could not read reward statistics from {path}: {error} Save them with "
            "sb3_ppg.procgen.save_reward_statistics(env, path). A VecNormalize pickle (VecNormalize.save) is not "
            "loaded here, since unpickling runs whatever code the file holds; if you trust it, load it yourself with "
            "VecNormalize.load(path, venv) and save its statistics with save_reward_statistics."
        ) from error
    if arrays["mean"].shape != () or arrays["var"].shape != ():
        raise ValueError(f"{path} holds statistics of shape {arrays['mean'].shape}, not of a scalar reward.")
    rms = RunningMeanStd(shape=())
    rms.mean, rms.var, rms.count = arrays["mean"].copy(), arrays["var"].copy(), float(metadata["count"])
    return rms, float(metadata["epsilon"])
