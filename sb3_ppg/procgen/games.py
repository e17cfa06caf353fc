"""
The 16 Procgen games, their distribution modes and options, checked before procgen sees them (procgen reports bad
options with bare assertions or aborts the process), and the gymnasium ids ``procgen/<game>-v0``.
"""

from typing import Any

import gymnasium
import numpy as np

from sb3_ppg.procgen.backend import check_resource_root, require_backend

# The 16 games of the Procgen benchmark, in procgen's order
PROCGEN_GAMES = (
    "bigfish",
    "bossfight",
    "caveflyer",
    "chaser",
    "climber",
    "coinrun",
    "dodgeball",
    "fruitbot",
    "heist",
    "jumper",
    "leaper",
    "maze",
    "miner",
    "ninja",
    "plunder",
    "starpilot",
)

# Which games support each distribution mode (procgen's ``Game::parse_options`` aborts the process with a C++
# assertion for any other pair, and ``ProcgenGym3Env`` checks "exploration" against ``EXPLORATION_LEVEL_SEEDS``)
DISTRIBUTION_MODES: dict[str, tuple[str, ...]] = {
    "easy": PROCGEN_GAMES,
    "hard": PROCGEN_GAMES,
    "extreme": ("chaser", "dodgeball", "leaper", "starpilot"),
    "memory": ("caveflyer", "dodgeball", "heist", "jumper", "maze", "miner"),
    "exploration": ("caveflyer", "climber", "coinrun", "heist", "jumper", "leaper", "maze", "ninja"),
}

# Options of ``procgen.ProcgenGym3Env`` other than the game, the distribution mode and the level range,
# with procgen's defaults (``resource_root``: a string, ``None`` means procgen's own assets)
PROCGEN_OPTIONS: dict[str, Any] = {
    "center_agent": True,
    "use_backgrounds": True,
    "use_monochrome_assets": False,
    "restrict_themes": False,
    "use_generated_assets": False,
    "paint_vel_info": False,
    "use_sequential_levels": False,
    "debug_mode": 0,
    "resource_root": None,
}

PROCGEN_OBSERVATION_SHAPE = (64, 64, 3)
PROCGEN_N_ACTIONS = 15
# Procgen passes integer options as int32 and asserts ``-2**31 < value < 2**31``
MAX_INT32 = 2**31 - 1


def procgen_seed(seed: int) -> int:
    """Map any integer seed into procgen's ``rand_seed`` range (``seed % (2**31 - 1)``, a python int)."""
    return int(seed) % MAX_INT32


def check_int(name: str, value: Any, minimum: int, maximum: int = MAX_INT32) -> int:
    """Check that ``value`` is an integer (not a bool) in ``[minimum, maximum]``; return it as a python int."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"`{name}` must be an integer, got {value!r} of type {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ValueError(f"`{name}` must be between {minimum} and {maximum}, got {value}")
    return int(value)


def check_procgen_options(
    env_name: str,
    distribution_mode: str,
    num_levels: int,
    start_level: int,
    procgen_kwargs: dict[str, Any],
) -> dict[str, Any]:
    """
    Validate the game and the procgen options (procgen asserts or aborts the process on bad ones) and return them as
    ``procgen_kwargs`` attributes store them.

    :param procgen_kwargs: Other procgen options (keys of ``PROCGEN_OPTIONS``)
    """
    if env_name not in PROCGEN_GAMES:
        raise ValueError(f"Unknown procgen game {env_name!r}. Valid games: {', '.join(PROCGEN_GAMES)}")
    require_backend()  # no Procgen package: an error naming the extra that installs one
    if distribution_mode not in DISTRIBUTION_MODES:
        raise ValueError(
            f"Unknown distribution_mode {distribution_mode!r}. Valid modes: {', '.join(DISTRIBUTION_MODES)} "
            "(not every game supports every mode)"
        )
    if env_name not in DISTRIBUTION_MODES[distribution_mode]:
        game_modes = [mode for mode, games in DISTRIBUTION_MODES.items() if env_name in games]
        raise ValueError(
            f"{env_name} does not support distribution_mode={distribution_mode!r}: it supports {', '.join(game_modes)}. "
            f"Games with the {distribution_mode!r} mode: {', '.join(DISTRIBUTION_MODES[distribution_mode])}"
        )
    num_levels = check_int("num_levels", num_levels, 0)
    start_level = check_int("start_level", start_level, 0)
    if start_level + num_levels > MAX_INT32:
        raise ValueError(
            f"start_level + num_levels must be at most 2**31 - 1 (levels are int32 seeds), got {start_level} + {num_levels}"
        )
    if distribution_mode == "exploration" and (num_levels != 0 or start_level != 0):
        raise ValueError(
            "distribution_mode='exploration' plays one fixed level per game, "
            f"num_levels and start_level must be left at 0, got num_levels={num_levels}, start_level={start_level}"
        )
    options: dict[str, Any] = {"distribution_mode": distribution_mode, "num_levels": num_levels, "start_level": start_level}
    for key, value in procgen_kwargs.items():
        if key not in PROCGEN_OPTIONS:
            raise ValueError(
                f"Unknown procgen option {key!r}. Valid options: distribution_mode, num_levels, start_level, "
                f"{', '.join(PROCGEN_OPTIONS)}"
            )
        default = PROCGEN_OPTIONS[key]
        if isinstance(default, bool):
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"Procgen option {key!r} must be a bool, got {value!r}")
            options[key] = bool(value)
        elif isinstance(default, int):
            options[key] = check_int(key, value, 0)
        elif key == "resource_root" and value is not None:
            if not isinstance(value, str):
                raise ValueError(f"Procgen option 'resource_root' must be a folder name (a string), got {value!r}")
            options[key] = check_resource_root(value)
        else:
            if not isinstance(value, str):
                raise ValueError(f"Procgen option {key!r} must be a string, got {value!r}")
            options[key] = value
    return options


def check_argument_names(function: str, kwargs: dict[str, Any], other_names: dict[str, str]) -> None:
    """
    Refuse a keyword argument that is another API's name for something ``function`` takes or sets itself (procgen's
    ``rand_seed``, ``num``, ...), with what to pass instead.

    :param other_names: the names to refuse, each with the fix
    """
    for key, fix in other_names.items():
        if key in kwargs:
            raise ValueError(f"{function} got {key}={kwargs[key]!r}: {fix}.")


def check_render_mode(render_mode: str | None) -> None:
    """
    Check that procgen supports the render mode.

    :param render_mode: ``None`` or ``"rgb_array"``
    """
    if render_mode not in (None, "rgb_array"):
        raise ValueError(f"Procgen envs support render_mode=None or 'rgb_array', got {render_mode!r}")


def register_procgen_envs() -> None:
    """Register the gymnasium ids ``procgen/<game>-v0`` of the 16 games (once; procgen options go to ``gymnasium.make``)."""
    for game in PROCGEN_GAMES:
        env_id = f"procgen/{game}-v0"
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point="sb3_ppg.procgen:ProcgenGymnasiumEnv", kwargs={"env_name": game})
