"""Procgen presets: make_procgen_env(preset=...), the PPG arguments of each preset, and the zoo files that match them."""

import inspect
from pathlib import Path

import pytest
import yaml
from stable_baselines3.common.vec_env import unwrap_vec_normalize

from sb3_ppg import PPG
from sb3_ppg.procgen import PROCGEN_GAMES, PROCGEN_PRESETS, get_procgen_preset, make_procgen_env
from sb3_ppg.procgen.wrappers import DEFAULT_ENV_KWARGS

HYPERPARAMS = Path(__file__).parent.parent / "sb3_ppg" / "cli" / "hyperparams"


def chain_settings(env) -> dict:
    """The settings a make_procgen_env chain was built with."""
    vec_normalize = unwrap_vec_normalize(env)
    procgen_env = vec_normalize.venv.venv
    settings = dict(
        distribution_mode=procgen_env.procgen_kwargs["distribution_mode"],
        num_levels=procgen_env.procgen_kwargs["num_levels"],
        start_level=procgen_env.procgen_kwargs["start_level"],
        normalize_reward=vec_normalize.norm_reward,
    )
    if vec_normalize.norm_reward:  # the reward-normalization settings matter only then
        settings.update(reward_gamma=vec_normalize.gamma, clip_reward=vec_normalize.clip_reward)
    return settings


@pytest.mark.parametrize("name", ["paper", "cleanrl", "easy", None])
def test_preset_sets_the_env(name):
    env = make_procgen_env("bossfight", n_envs=2, preset=name, num_threads=0)
    expected = DEFAULT_ENV_KWARGS if name is None else get_procgen_preset(name).env_kwargs
    assert chain_settings(env) == dict(expected)
    env.close()


def test_presets_differ_where_the_references_do():
    paper, cleanrl = PROCGEN_PRESETS["paper"], PROCGEN_PRESETS["cleanrl"]
    # The paper's code normalizes each rollout's rewards (PPG's normalize_reward), CleanRL's every step (VecNormalize)
    assert paper.env_kwargs["distribution_mode"] == "hard" and paper.env_kwargs["normalize_reward"] is False
    assert paper.algorithm_kwargs["normalize_reward"] is True
    assert dict(paper.algorithm_kwargs["reward_normalizer_kwargs"]) == dict(gamma=0.99, clip_reward=10.0)
    assert cleanrl.env_kwargs["distribution_mode"] == "easy" and cleanrl.env_kwargs["reward_gamma"] == 0.999
    assert cleanrl.env_kwargs["normalize_reward"] is True and "normalize_reward" not in cleanrl.algorithm_kwargs
    assert get_procgen_preset("easy") is cleanrl


def test_explicit_arguments_override_the_preset():
    env = make_procgen_env(
        "bossfight",
        n_envs=2,
        preset="paper",
        distribution_mode="easy",
        num_levels=200,
        normalize_reward=True,
        reward_gamma=0.9,
        num_threads=0,
    )
    assert chain_settings(env) == dict(
        distribution_mode="easy", num_levels=200, start_level=0, normalize_reward=True, reward_gamma=0.9, clip_reward=10.0
    )
    env.close()


def test_paper_preset_refuses_a_second_reward_normalization():
    """The paper preset's PPG normalizes the rewards: over an env that normalizes them too, a clear error."""
    env = make_procgen_env("bossfight", n_envs=2, preset="paper", normalize_reward=True, num_threads=0)
    with pytest.raises(ValueError, match="would be scaled twice"):
        PPG("ProcgenCnn", env, **dict(get_procgen_preset("paper").ppg_kwargs(2), n_steps=8, n_policy_iters=2))
    env.close()


def test_unknown_preset():
    with pytest.raises(ValueError, match="Unknown Procgen preset 'atari': choose one of 'paper', 'cleanrl', 'easy'"):
        make_procgen_env("bossfight", n_envs=2, preset="atari")


@pytest.mark.parametrize("name", ["paper", "cleanrl"])
def test_ppg_kwargs_build_the_model(name):
    preset = get_procgen_preset(name)
    env = make_procgen_env("bossfight", n_envs=2, preset=name, num_threads=0)
    kwargs = preset.ppg_kwargs(env.num_envs)
    assert kwargs["aux_batch_rollouts"] == 1 and preset.ppg_kwargs(64)["aux_batch_rollouts"] == 4
    kwargs["policy_kwargs"]["normed_init"] = True  # plain dicts, free to change: the preset stays as it is
    assert "normed_init" not in preset.algorithm_kwargs["policy_kwargs"]
    del kwargs["policy_kwargs"]["normed_init"]
    model = PPG("ProcgenCnn", env, **dict(kwargs, n_steps=8, n_policy_iters=2, n_aux_epochs=1))
    assert model.policy.arch == preset.algorithm_kwargs["policy_kwargs"]["arch"]
    assert model.max_grad_norm == preset.algorithm_kwargs["max_grad_norm"]
    assert model.separate_aux_optimizer == preset.algorithm_kwargs["separate_aux_optimizer"]
    assert (model.reward_normalizer is not None) == (name == "paper")
    model.learn(2 * 8 * 2)
    assert model.n_aux_phases == 1
    env.close()


@pytest.mark.parametrize("name", ["paper", "cleanrl"])
def test_zoo_file_matches_the_preset(name):
    """Every Procgen entry of the packaged zoo file holds the preset's settings (for the preset's number of envs)."""
    preset = get_procgen_preset(name)
    entries = yaml.safe_load((HYPERPARAMS / preset.zoo_file).read_text())
    procgen_entries = {key: value for key, value in entries.items() if key.startswith("procgen/")}
    assert sorted(procgen_entries) == sorted(f"procgen/{game}-v0" for game in PROCGEN_GAMES)
    expected = preset.ppg_kwargs(preset.n_envs)
    for env_id, entry in procgen_entries.items():
        env_kwargs = entry["env_kwargs"]
        settings = dict(
            distribution_mode=env_kwargs["distribution_mode"],
            num_levels=env_kwargs["num_levels"],
            start_level=env_kwargs["start_level"],
            normalize_reward="normalize" in entry,
        )
        if "normalize" in entry:
            normalize = eval(entry["normalize"], {})  # the zoo evaluates this string the same way
            assert normalize["norm_reward"] and not normalize["norm_obs"], env_id
            # The zoo copies the `gamma` hyperparameter into VecNormalize when `normalize` does not set one
            settings.update(reward_gamma=normalize.get("gamma", entry.get("gamma")), clip_reward=normalize["clip_reward"])
        assert settings == dict(preset.env_kwargs), env_id
        assert entry["n_envs"] == preset.n_envs and entry["n_timesteps"] == preset.total_timesteps, env_id
        assert eval(entry["policy_kwargs"], {}) == expected["policy_kwargs"], env_id
        assert entry["aux_batch_rollouts"] == expected["aux_batch_rollouts"], env_id
        assert entry["batch_size"] == entry["n_envs"] * entry["n_steps"] // 8, env_id  # what batch_size=None gives
        for key, value in expected.items():
            if key not in ("policy_kwargs", "aux_batch_rollouts", "batch_size"):
                assert entry.get(key, ppg_default(key)) == value, (env_id, key)


def ppg_default(key: str):
    """PPG's default for a hyperparameter a zoo entry leaves out."""
    return inspect.signature(PPG).parameters[key].default


def test_command_line_presets_are_the_same_files():
    from sb3_ppg.cli.arguments import hyperparams_file

    for name, preset in PROCGEN_PRESETS.items():
        assert Path(hyperparams_file(name)).name == preset.zoo_file
    assert hyperparams_file("easy") == hyperparams_file("cleanrl")
