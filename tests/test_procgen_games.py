"""sb3_ppg.procgen.games: the game list, the distribution modes and the checks of procgen's options."""

import numpy as np
import pytest

from sb3_ppg.procgen import (
    DISTRIBUTION_MODES,
    PROCGEN_GAMES,
    ProcgenGymnasiumEnv,
    ProcgenVecEnv,
    make_procgen_env,
    procgen_seed,
)
from sb3_ppg.procgen.wrappers import make_monitored_procgen_env

# Random play ends a bossfight episode every ~50 steps in easy mode: episode ends come quickly
GAME = "bossfight"


def test_constants_match_procgen():
    """The games and modes are those of the installed Procgen package (procgen / procgen-mirror, or procgen-gym)."""
    from sb3_ppg.procgen.backend import ENV_MODULE

    DISTRIBUTION_MODE_DICT, ENV_NAMES = ENV_MODULE.DISTRIBUTION_MODE_DICT, ENV_MODULE.ENV_NAMES
    EXPLORATION_LEVEL_SEEDS = ENV_MODULE.EXPLORATION_LEVEL_SEEDS
    assert PROCGEN_GAMES == tuple(ENV_NAMES)
    assert len(PROCGEN_GAMES) == 16
    assert set(DISTRIBUTION_MODES) == set(DISTRIBUTION_MODE_DICT)
    assert set(DISTRIBUTION_MODES["exploration"]) == set(EXPLORATION_LEVEL_SEEDS)
    assert procgen_seed(2**31 - 1) == 0
    assert procgen_seed(-1) == 2**31 - 2
    assert procgen_seed(np.uint64(2**40)) == 2**40 % (2**31 - 1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(env_name="pong"), "Unknown procgen game 'pong'. Valid games: bigfish, bossfight,"),
        (dict(distribution_mode="insane"), "Valid modes: easy, hard, extreme, memory, exploration"),
        (dict(env_name="coinrun", distribution_mode="memory"), "coinrun does not support .* it supports easy, hard, explo"),
        (dict(env_name="bigfish", distribution_mode="exploration"), "Games with the 'exploration' mode: caveflyer"),
        (dict(num_levels=-1), "`num_levels` must be between 0 and"),
        (dict(start_level=-5), "`start_level` must be between 0 and"),
        (dict(num_levels=1.5), "`num_levels` must be an integer"),
        (dict(start_level=True), "`start_level` must be an integer"),
        (dict(num_levels=2**30, start_level=2**30), "start_level \\+ num_levels must be at most"),
        (dict(env_name="maze", distribution_mode="exploration", num_levels=10), "exploration.* num_levels and start_level"),
        (dict(use_background=False), "Unknown procgen option 'use_background'. Valid options: .*use_backgrounds"),
        (dict(restrict_themes="yes"), "'restrict_themes' must be a bool"),
        (dict(render_mode="human"), "render_mode=None or 'rgb_array'"),
    ],
)
def test_bad_options(kwargs, match):
    kwargs = {"env_name": GAME, **kwargs}
    for make in (
        lambda: ProcgenVecEnv(2, **kwargs),
        lambda: ProcgenGymnasiumEnv(**kwargs),
        lambda: make_procgen_env(n_envs=2, **kwargs),
    ):
        with pytest.raises(ValueError, match=match):
            make()


@pytest.mark.parametrize(
    "make, match",
    [
        # procgen's own keyword for the seed: "got multiple values for keyword argument 'rand_seed'" on main
        (
            lambda: make_procgen_env(GAME, n_envs=2, rand_seed=0),
            r"make_procgen_env\(\) got rand_seed=0: .* seed= instead",
        ),
        (lambda: make_procgen_env(GAME, n_envs=2, num_envs=3), r"got num_envs=3: pass the number of games as n_envs"),
        (lambda: make_procgen_env(GAME, n_envs=2, num=3), r"got num=3: pass the number of games as n_envs"),
        (
            lambda: make_procgen_env(GAME, n_envs=2, channels_first=False),
            r"always gives channel-first .*channels_first=False",
        ),
        (lambda: make_monitored_procgen_env(2, GAME, num_envs=2), r"got num_envs=2: pass the number of games as n_envs"),
        # removed with overlap_rollouts: refused with the reason, not passed on to procgen
        (lambda: make_procgen_env(GAME, n_envs=2, n_groups=2), r"got n_groups=2: env groups were removed .*not to pay"),
        (lambda: make_monitored_procgen_env(2, GAME, n_groups=2), r"got n_groups=2: env groups were removed"),
        (lambda: ProcgenVecEnv(2, GAME, seed=1), r"ProcgenVecEnv got seed=1: pass the seed .* as rand_seed"),
        (lambda: ProcgenVecEnv(2, GAME, num=2), r"ProcgenVecEnv got num=2: pass the number of games as num_envs"),
        (lambda: ProcgenGymnasiumEnv(GAME, rand_seed=0), r"got rand_seed=0: seed the level sampler with env.reset\(seed="),
        (lambda: ProcgenGymnasiumEnv(GAME, num_envs=4), r"got num_envs=4: .* plays one game; ProcgenVecEnv"),
    ],
    ids=[
        "rand_seed",
        "num_envs",
        "num",
        "channels_first",
        "monitored-num_envs",
        "n_groups",
        "monitored-n_groups",
        "vec-seed",
        "vec-num",
        "gym-rand_seed",
        "gym-num",
    ],
)
def test_another_apis_argument_names_are_refused(make, match):
    """Names that sb3_ppg sets itself, or takes under another name, get an error naming the argument to use."""
    with pytest.raises(ValueError, match=match):
        make()


def test_supported_modes_build():
    # One pair per non-default mode (an unsupported pair would abort the process in procgen's C++)
    for game, mode in (("starpilot", "extreme"), ("maze", "memory"), ("maze", "exploration")):
        env = ProcgenVecEnv(1, game, distribution_mode=mode, num_threads=0)
        env.reset()
        env.step(np.array([0]))
        env.close()
    env = ProcgenGymnasiumEnv("maze", distribution_mode="exploration")
    env.reset(seed=0)
    env.close()
