"""The state of a VecEnv chain (wrappers' statistics, the envs' own states) for checkpoints, and putting it back."""

import pickle
import warnings
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    VecCheckNan,
    VecEnv,
    VecEnvWrapper,
    VecExtractDictObs,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
)

# Wrappers whose behaviour depends on nothing but their settings
STATELESS_WRAPPERS = (VecTransposeImage, VecCheckNan, VecExtractDictObs)
#: Arguments of a gymnasium env's ``make`` that do not change its episodes
UNCOMPARED_ENV_KWARGS = ("render_mode",)


class EnvMismatchError(ValueError):
    """The env given to resume a checkpoint does not fit the checkpoint's (its wrappers, its games' settings): the
    checkpoint itself is fine, and an older one would not fit either."""


def vec_env_chain(venv: VecEnv) -> list[VecEnv]:
    """The VecEnv and the wrapped ones, outermost first, the base VecEnv last."""
    chain = [venv]
    while isinstance(chain[-1], VecEnvWrapper):
        chain.append(chain[-1].venv)
    return chain


def _monitors(env: gym.Env) -> list[Monitor]:
    """The ``Monitor`` wrappers of a gymnasium env, outermost first."""
    monitors = []
    while isinstance(env, gym.Wrapper):
        if isinstance(env, Monitor):
            monitors.append(env)
        env = env.env
    return monitors


def _pickle_envs(layer: DummyVecEnv) -> bytes:
    """
    Pickle a ``DummyVecEnv``'s envs (with their random generators). The CSV writers of their ``Monitor`` wrappers
    (open files) are left out: on resume, the envs keep writing to the files of the env they replace.
    """
    monitors = [monitor for env in layer.envs for monitor in _monitors(env)]
    writers = [monitor.results_writer for monitor in monitors]
    try:
        for monitor in monitors:
            monitor.results_writer = None
        return cloudpickle.dumps({"envs": layer.envs, "seeds": layer._seeds, "options": layer._options})
    finally:
        for monitor, writer in zip(monitors, writers, strict=True):
            monitor.results_writer = writer


def monitor_log_sizes(venv: VecEnv) -> dict[str, int]:
    """
    The size of every episode log (``*.monitor.csv``) that the chain writes in this process: those of ``VecMonitor``
    layers and of the ``Monitor`` wrappers of a ``DummyVecEnv``'s envs (a checkpoint records them, so that a resumed
    run can cut the episodes logged after the checkpoint; see :mod:`sb3_ppg.cli.experiment_manager`).

    :param venv: The model's VecEnv
    :return: ``{real path of the file: bytes written so far}``
    """
    writers = []
    for layer in vec_env_chain(venv):
        if isinstance(layer, VecMonitor):
            writers.append(layer.results_writer)
        elif isinstance(layer, DummyVecEnv):
            writers += [monitor.results_writer for env in layer.envs for monitor in _monitors(env)]
    sizes = {}
    for writer in writers:
        if writer is not None and not writer.file_handler.closed:
            writer.file_handler.flush()
            sizes[writer.file_handler.name] = writer.file_handler.tell()
    return sizes


def native_env_settings(venv: VecEnv) -> dict[str, Any] | None:
    """
    The settings that define the games of a native VecEnv (one with ``get_env_states()``, such as ``ProcgenVecEnv``),
    as its ``get_env_settings()`` gives them: the game states it saves only fit games built with the same settings.

    :param venv: a VecEnv with ``get_env_states()``
    :return: the settings (JSON values), or None for a VecEnv without ``get_env_settings()``
    """
    get_env_settings = getattr(venv, "get_env_settings", None)
    return get_env_settings() if callable(get_env_settings) else None


def env_spec_settings(env: gym.Env) -> dict[str, Any] | None:
    """
    What defines a gymnasium env's episodes as far as its spec tells: its id and the plain (str, number, bool, None)
    arguments it was made with, but ``render_mode``. None for an env made without ``gymnasium.make``.
    """
    try:
        spec = env.spec
    except Exception:  # a wrapper whose spec cannot be built
        return None
    if spec is None:
        return None
    kwargs = {
        key: value
        for key, value in (spec.kwargs or {}).items()
        if key not in UNCOMPARED_ENV_KWARGS and (value is None or isinstance(value, (str, int, float, bool)))
    }
    return {"id": spec.id, **kwargs}


def _check_settings(saved: dict[str, Any], current: dict[str, Any], what: str) -> None:
    """Raise an ``EnvMismatchError`` naming every setting of ``what`` that differs between a checkpoint and the env."""
    differ = [key for key in dict.fromkeys([*saved, *current]) if saved.get(key) != current.get(key)]
    if differ:
        values = "; ".join(f"{key}={current.get(key)!r} in the env, {saved.get(key)!r} in the checkpoint" for key in differ)
        raise EnvMismatchError(
            f"The env does not fit the checkpoint: {what} differ ({values}). The states the checkpoint saved only fit "
            "the run's settings: build the env with them to resume the run, or start a new run from the checkpoint's "
            "weights with PPG.load('<checkpoint folder>/model.zip', env=...)."
        )


def check_env_settings(venv: VecEnv, description: dict[str, Any]) -> None:
    """
    Check, before anything is restored, that a VecEnv chain's games have the settings of those whose states a
    checkpoint saved (``get_vec_env_state`` records them): restoring Procgen's states into another game ends the
    process (a C++ assertion), into other levels it would continue silently on the wrong games, and a
    ``DummyVecEnv``'s saved envs would replace envs made with other settings.

    :param venv: the env given to resume with (the same wrappers as the checkpoint's)
    :param description: the checkpoint's description of its chain
    :raises EnvMismatchError: naming each setting that differs, with both values
    """
    for layer, saved in zip(vec_env_chain(venv), description["layers"], strict=True):
        if "settings" in saved:
            what = f"the settings of its {type(layer).__name__} games"
            _check_settings(saved["settings"], native_env_settings(layer) or {}, what)
        if "env_specs" in saved and isinstance(layer, DummyVecEnv):
            for index, (saved_spec, env) in enumerate(zip(saved["env_specs"], layer.envs, strict=False)):
                _check_settings(saved_spec or {}, env_spec_settings(env) or {}, f"the settings of its env {index}")


def _type_name(venv: VecEnv) -> str:
    return f"{type(venv).__module__}.{type(venv).__qualname__}"


def _rms_arrays(prefix: str, rms: RunningMeanStd | dict[str, RunningMeanStd]) -> dict[str, np.ndarray]:
    if isinstance(rms, dict):
        arrays: dict[str, np.ndarray] = {}
        for key, sub in rms.items():
            arrays.update(_rms_arrays(f"{prefix}.{key}", sub))
        return arrays
    return {
        f"{prefix}.mean": np.asarray(rms.mean),
        f"{prefix}.var": np.asarray(rms.var),
        f"{prefix}.count": np.asarray(rms.count),
    }


def _set_rms(prefix: str, rms: RunningMeanStd | dict[str, RunningMeanStd], arrays: dict[str, np.ndarray]) -> None:
    if isinstance(rms, dict):
        for key, sub in rms.items():
            _set_rms(f"{prefix}.{key}", sub, arrays)
        return
    for name in ("mean", "var"):
        value = arrays[f"{prefix}.{name}"]
        if np.shape(value) != np.shape(getattr(rms, name)):
            raise ValueError(f"{prefix}.{name} has shape {np.shape(value)}, the env's has {np.shape(getattr(rms, name))}")
        setattr(rms, name, value.copy())
    rms.count = float(arrays[f"{prefix}.count"])


def get_vec_env_state(venv: VecEnv) -> tuple[dict[str, Any], dict[str, np.ndarray], bytes | None]:
    """
    Everything a VecEnv chain needs to continue exactly where it is: the statistics of ``VecNormalize``,
    ``VecMonitor`` and ``VecFrameStack`` as plain arrays, and the envs' states. A ``DummyVecEnv``'s envs are
    pickled (with their random generators); a VecEnv with ``get_env_states()`` (e.g. Procgen's native env)
    gives its own. Where no state can be had (``SubprocVecEnv``, an env that cannot be pickled) the description
    says why, and resuming will restart the episodes.

    :param venv: the model's VecEnv
    :return: (JSON description, arrays, pickled envs or None)
    """
    layers: list[dict[str, Any]] = []
    arrays: dict[str, np.ndarray] = {}
    pickled_envs = None
    for index, layer in enumerate(vec_env_chain(venv)):
        prefix = f"env{index}"
        description: dict[str, Any] = {"type": _type_name(layer)}
        if isinstance(layer, VecNormalize):
            if layer.norm_obs:
                arrays.update(_rms_arrays(f"{prefix}.obs_rms", layer.obs_rms))
            arrays.update(_rms_arrays(f"{prefix}.ret_rms", layer.ret_rms))
            arrays[f"{prefix}.returns"] = np.asarray(layer.returns)
        elif isinstance(layer, VecMonitor):
            arrays[f"{prefix}.episode_returns"] = np.asarray(layer.episode_returns)
            arrays[f"{prefix}.episode_lengths"] = np.asarray(layer.episode_lengths)
            description["episode_count"] = int(layer.episode_count)
            description["t_start"] = float(layer.t_start)
        elif isinstance(layer, VecFrameStack) and isinstance(layer.stacked_obs.stacked_obs, np.ndarray):
            arrays[f"{prefix}.stacked_obs"] = layer.stacked_obs.stacked_obs
        elif isinstance(layer, VecEnvWrapper) and not isinstance(layer, STATELESS_WRAPPERS):
            description["unsaved"] = "its state is not saved (unknown wrapper)"
        elif not isinstance(layer, VecEnvWrapper):
            if hasattr(layer, "get_env_states") and getattr(layer, "has_env_states", True):
                for env_index, state in enumerate(layer.get_env_states()):
                    arrays[f"{prefix}.state{env_index}"] = np.frombuffer(bytes(state), dtype=np.uint8)
                description["native_states"] = True
                settings = native_env_settings(layer)
                if settings is not None:
                    description["settings"] = settings
            elif isinstance(layer, DummyVecEnv):
                try:
                    pickled_envs = _pickle_envs(layer)
                except Exception as error:
                    description["unsaved"] = f"its envs cannot be pickled ({type(error).__name__}: {error})"
                else:
                    description["env_specs"] = [env_spec_settings(env) for env in layer.envs]
            else:
                description["unsaved"] = "its envs' states cannot be read (they run elsewhere)"
        layers.append(description)
    return {"layers": layers}, arrays, pickled_envs


def set_vec_env_state(
    venv: VecEnv, description: dict[str, Any], arrays: dict[str, np.ndarray], pickled_envs: bytes | None
) -> bool:
    """
    Put back a state from ``get_vec_env_state`` into a VecEnv chain of the same wrappers (the envs of a
    ``DummyVecEnv`` are replaced by their saved copies).

    :return: whether the envs' own states were restored (False: the episodes restart, the caller warns)
    :raises EnvMismatchError: before anything is restored, when the wrappers or the games' settings differ
    """
    chain = vec_env_chain(venv)
    layers = description["layers"]
    saved_types = [layer["type"] for layer in layers]
    if saved_types != [_type_name(layer) for layer in chain]:
        raise EnvMismatchError(
            f"The env's VecEnv wrappers {[_type_name(layer) for layer in chain]} differ from the checkpoint's "
            f"{saved_types}: pass an env built the same way as the one of the run."
        )
    check_env_settings(venv, description)
    restored = True
    for index, (layer, saved) in enumerate(zip(chain, layers, strict=True)):
        prefix = f"env{index}"
        if isinstance(layer, VecNormalize):
            if layer.norm_obs:
                _set_rms(f"{prefix}.obs_rms", layer.obs_rms, arrays)
            _set_rms(f"{prefix}.ret_rms", layer.ret_rms, arrays)
            layer.returns = arrays[f"{prefix}.returns"].copy()
        elif isinstance(layer, VecMonitor):
            layer.episode_returns = arrays[f"{prefix}.episode_returns"].copy()
            layer.episode_lengths = arrays[f"{prefix}.episode_lengths"].copy()
            layer.episode_count = saved["episode_count"]
            # The time column of the episode log continues from the run's start (absent from early checkpoints)
            layer.t_start = saved.get("t_start", layer.t_start)
        elif isinstance(layer, VecFrameStack) and f"{prefix}.stacked_obs" in arrays:
            layer.stacked_obs.stacked_obs = arrays[f"{prefix}.stacked_obs"].copy()
        elif "unsaved" in saved and isinstance(layer, VecEnvWrapper):
            warnings.warn(f"The state of the wrapper {saved['type']} was not saved: it restarts from its current state.")
        elif not isinstance(layer, VecEnvWrapper):
            if saved.get("native_states"):
                layer.set_env_states([arrays[f"{prefix}.state{i}"].tobytes() for i in range(layer.num_envs)])  # type: ignore[attr-defined]
            elif pickled_envs is not None and isinstance(layer, DummyVecEnv):
                state = pickle.loads(pickled_envs)
                if len(state["envs"]) != layer.num_envs:
                    raise ValueError(f"The checkpoint holds {len(state['envs'])} envs, the env has {layer.num_envs}.")
                for env_index, env in enumerate(state["envs"]):
                    # The restored Monitors write to the files of the env they replace
                    live_monitors, saved_monitors = _monitors(layer.envs[env_index]), _monitors(env)
                    if len(live_monitors) == len(saved_monitors):
                        for live, saved_monitor in zip(live_monitors, saved_monitors, strict=True):
                            saved_monitor.results_writer, live.results_writer = live.results_writer, None
                    layer.envs[env_index].close()
                    layer.envs[env_index] = env
                layer._seeds, layer._options = state["seeds"], state["options"]
            else:
                restored = False
    return restored


def unsaved_parts(description: dict[str, Any]) -> list[str]:
    """Messages naming the parts of a VecEnv chain whose state ``get_vec_env_state`` could not save."""
    return [f"{layer['type']}: {layer['unsaved']}" for layer in description["layers"] if "unsaved" in layer]
