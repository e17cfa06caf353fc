"""Tests of the RL Zoo integration: ``python -m sb3_ppg.train`` / ``enjoy``, the packaged hyperparameters, Optuna."""

import argparse
import glob
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import optuna
import pandas as pd
import pytest
import yaml
from helpers import run_folder_args
from stable_baselines3.common.callbacks import EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecMonitor, VecNormalize

from sb3_ppg import PPG, PPGCheckpointCallback
from sb3_ppg.cli import arguments, enjoy, run_folders, train, vec_env, zoo
from sb3_ppg.common.envs import DICT_CARTPOLE_ID
from sb3_ppg.procgen import PROCGEN_GAMES, ProcgenVecEnv

PAPER_FILE = arguments.hyperparams_file("paper")
EASY_FILE = arguments.hyperparams_file("easy")
CLASSIC_IDS = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "Pendulum-v1", DICT_CARTPOLE_ID)
# Tiny PPG settings with at least one auxiliary phase (zoo -params syntax)
TINY_PARAMS = ["n_envs:2", "n_steps:16", "batch_size:16", "n_policy_iters:2", "n_aux_epochs:1", "aux_batch_rollouts:2"]


# Many tests here train less than one auxiliary phase on purpose (the state they check comes before it): the warning
# that learn() then trains as plain PPO is meant
pytestmark = [
    pytest.mark.usefixtures("registered_zoo"),
    pytest.mark.filterwarnings(r"ignore:learn\(total_timesteps=.*this learn\(\) trains as plain PPO"),
]


def load_yaml(path: str) -> dict:
    with open(path) as file_handler:
        return yaml.safe_load(file_handler)


def build_entry(config: str, env_id: str, overrides: dict, log_folder: Path) -> tuple:
    """Create the env and model of one packaged entry the way ``train`` does (without learning)."""
    manager = zoo.make_experiment_manager(
        argparse.Namespace(),
        "ppg",
        env_id,
        str(log_folder),
        eval_freq=-1,
        hyperparams=overrides,
        seed=0,
        verbose=0,
        device="cpu",
        config=config,
    )
    model, _ = manager.setup_experiment()
    return manager, model


# ----------------------------------------------------------------------------------------------------------------------
# Packaged hyperparameters


def test_packaged_hyperparams_keys():
    paper, easy = load_yaml(PAPER_FILE), load_yaml(EASY_FILE)
    procgen_ids = {f"procgen/{game}-v0" for game in PROCGEN_GAMES}
    assert procgen_ids | set(CLASSIC_IDS) == set(paper)
    assert procgen_ids == set(easy)
    for env_id in procgen_ids:
        # Anchors: every game has the same settings
        assert paper[env_id] == paper["procgen/bigfish-v0"]
        assert easy[env_id] == easy["procgen/bigfish-v0"]
    entry = paper["procgen/coinrun-v0"]
    assert entry["env_kwargs"]["distribution_mode"] == "hard"
    assert (entry["n_envs"], entry["n_steps"], entry["batch_size"]) == (256, 256, 8192)
    assert (entry["n_policy_iters"], entry["n_aux_epochs"], entry["aux_batch_rollouts"]) == (32, 6, 16)
    assert entry["n_timesteps"] == 1e8 and entry["max_grad_norm"] is None
    # Left out on purpose: the zoo would copy it into the reward normalization (paper: 0.99 there, 0.999 for RL)
    assert "gamma" not in entry
    entry = easy["procgen/coinrun-v0"]
    assert entry["env_kwargs"]["distribution_mode"] == "easy"
    assert (entry["n_envs"], entry["batch_size"], entry["aux_batch_rollouts"], entry["n_timesteps"]) == (64, 2048, 4, 25e6)


@pytest.mark.parametrize("env_id", [f"procgen/{game}-v0" for game in PROCGEN_GAMES])
def test_procgen_entries_construct(env_id: str, tmp_path: Path):
    # Fewer envs (and a matching minibatch) so the auxiliary buffer stays small: 2 x 32 x 256 frames (~0.2 GB, lazily
    # allocated) instead of 24 GiB for the paper's 256 envs; the paper's minibatches are whole env rollouts, so the
    # minibatch is one env's 256 steps
    _, model = build_entry(PAPER_FILE, env_id, {"n_envs": 2, "batch_size": 256}, tmp_path / "paper")
    assert isinstance(model, PPG)
    assert model.gamma == 0.999 and model.gae_lambda == 0.95 and model.ent_coef == 0.01 and model.vf_coef == 0.5
    assert model.max_grad_norm is None and model.clip_range_vf is None
    assert (model.policy_minibatches, model.batch_size, model.n_steps) == ("envs", 256, 256)
    assert (model.n_policy_iters, model.n_aux_epochs, model.aux_batch_rollouts) == (32, 6, 16)
    assert model.separate_aux_optimizer and model.policy.arch == "dual"
    assert model.policy.optimizer.defaults["eps"] == 1e-8
    assert isinstance(model.env.unwrapped, ProcgenVecEnv) and model.env.num_envs == 2
    assert model.env.unwrapped.procgen_kwargs["distribution_mode"] == "hard"
    vec_normalize = model.get_vec_normalize_env()
    assert vec_normalize is not None
    assert (vec_normalize.norm_obs, vec_normalize.norm_reward, vec_normalize.gamma) == (False, True, 0.99)
    assert model.aux_buffer.observations.dtype == np.uint8
    model.env.close()

    _, model = build_entry(EASY_FILE, env_id, {"n_envs": 2, "batch_size": 64}, tmp_path / "easy")
    assert model.gamma == 0.999 and model.max_grad_norm == 0.5 and model.vf_coef == 0.25
    assert model.clip_range_vf(1.0) == 0.2 and model.value_clipping == "max"
    assert model.policy_minibatches == "transitions"
    assert (model.n_policy_iters, model.n_aux_epochs, model.aux_batch_rollouts) == (32, 6, 4)
    assert not model.separate_aux_optimizer and model.policy.arch == "detach"
    assert model.env.unwrapped.procgen_kwargs["distribution_mode"] == "easy"
    assert model.get_vec_normalize_env().gamma == 0.999
    model.env.close()


@pytest.mark.parametrize("env_id", CLASSIC_IDS)
def test_classic_entries_construct(env_id: str, tmp_path: Path):
    manager, model = build_entry(PAPER_FILE, env_id, {}, tmp_path)
    assert isinstance(model, PPG)
    assert model.n_envs == load_yaml(PAPER_FILE)[env_id]["n_envs"]
    assert isinstance(model.env.unwrapped, DummyVecEnv)
    assert manager.deterministic_eval
    model.env.close()


@pytest.mark.parametrize(
    "config, env_id, params",
    [(PAPER_FILE, env_id, []) for env_id in CLASSIC_IDS]
    + [(PAPER_FILE, "procgen/coinrun-v0", TINY_PARAMS), (EASY_FILE, "procgen/starpilot-v0", TINY_PARAMS)],
    ids=[*CLASSIC_IDS, "paper-procgen", "easy-procgen"],
)
def test_entries_finish_with_a_total_that_is_not_a_multiple_of_the_rollout(config: str, env_id: str, params: list, tmp_path):
    # Regression: the last rollout ends beyond -n, where SB3's progress_remaining is negative and the entries' linear
    # schedules (lin_1e-3) gave a negative learning rate: the run crashed at its end without saving the model
    entry = load_yaml(config)[env_id]
    n_envs, n_steps = (2, 16) if params else (entry["n_envs"], entry["n_steps"])
    total = n_envs * n_steps + 1  # two rollouts, the second ending beyond the total
    train.main(["--env", env_id, "-conf", config, "-n", str(total), "--eval-freq", "-1", *run_folder_args(tmp_path)]
               + (["-params", *params] if params else []))  # fmt: skip
    name = env_id.replace("/", "-")
    model = PPG.load(tmp_path / "ppg" / f"{name}_1" / f"{name}.zip", device="cpu")
    assert model.num_timesteps == 2 * n_envs * n_steps
    # The last update ran at progress 0 (a linear learning rate of 0), not below
    assert model._current_progress_remaining == 0.0
    assert model.lr_schedule(model._current_progress_remaining) >= 0.0


# ----------------------------------------------------------------------------------------------------------------------
# Zoo plumbing


def test_folders_in_the_home_folder(monkeypatch):
    """
    A folder the run writes to may start with "~", which the shell leaves in "--log-folder=~/logs": the home folder,
    not a folder named "~" (issue 29); so may --resume's.
    """
    for name in ("HOME", "USERPROFILE"):
        monkeypatch.setenv(name, "/home/someone")
    argv = arguments.build_zoo_argv(["--env", "CartPole-v1", "--log-folder=~/logs", "-tb", "~/tb", "--seed", "1"])
    assert "--log-folder=/home/someone/logs" in argv and argv[argv.index("-tb") + 1] == "/home/someone/tb"
    assert arguments.build_zoo_argv(["-f", "~/logs"])[2:4] == ["-f", "/home/someone/logs"]
    started = {}
    monkeypatch.setattr(train, "run_zoo", lambda command, argv, **kwargs: started.update(kwargs))
    train.main(["--env", "CartPole-v1", "--resume=~/logs/ppg/CartPole-v1_1"])
    assert started == dict(resume="/home/someone/logs/ppg/CartPole-v1_1")


def test_build_zoo_argv():
    argv = arguments.build_zoo_argv(["--env", "CartPole-v1", "-n", "100"])
    assert argv[:2] == ["--algo", "ppg"] and argv[-2:] == ["-conf", PAPER_FILE]
    argv = arguments.build_zoo_argv(["--env", "procgen/coinrun-v0", "--preset", "easy", "--seed", "3"])
    assert "--preset" not in argv and "easy" not in argv and argv[-2:] == ["-conf", EASY_FILE]
    argv = arguments.build_zoo_argv(["-conf", "my.yml"])
    assert argv == ["--algo", "ppg", "-conf", "my.yml"]
    with pytest.raises(ValueError, match="only one"):
        arguments.build_zoo_argv(["--preset", "easy", "-conf", "my.yml"])
    # Another algorithm keeps the zoo's own hyperparameters
    assert arguments.build_zoo_argv(["--algo", "ppo"]) == ["--algo", "ppo"]

    argv = enjoy.build_zoo_argv(["--env", "procgen/coinrun-v0"])
    assert {"--stochastic", "--no-render"} <= set(argv) and argv[argv.index("-f") + 1] == "logs"
    argv = enjoy.build_zoo_argv(["--env", "procgen/coinrun-v0", "--deterministic", "-f", "x", "--algo", "ppg"])
    assert "--stochastic" not in argv and argv.count("-f") == 1 and argv.count("--algo") == 1
    assert "--stochastic" not in enjoy.build_zoo_argv(["--env", "CartPole-v1"])


def test_experiment_manager_stochastic_procgen_eval(tmp_path: Path):
    manager = zoo.make_experiment_manager(argparse.Namespace(), "ppg", "procgen/coinrun-v0", str(tmp_path))
    assert not manager.deterministic_eval
    manager = zoo.make_experiment_manager(argparse.Namespace(), "ppg", "CartPole-v1", str(tmp_path), vec_env_type="subproc")
    assert manager.deterministic_eval
    assert manager.vec_env_class.fallback_vec_env_cls is SubprocVecEnv
    assert vec_env.is_procgen_env_id("procgen/starpilot-v0") and not vec_env.is_procgen_env_id("CartPole-v1")


def test_vec_env_factory(tmp_path: Path):
    factory = vec_env.ProcgenVecEnvFactory()
    env = make_vec_env(
        "procgen/maze-v0",
        n_envs=3,
        seed=0,
        monitor_dir=str(tmp_path),
        env_kwargs=dict(distribution_mode="easy", num_levels=5, start_level=7),
        vec_env_cls=factory,  # type: ignore[arg-type]
    )
    # The first layers of make_procgen_env's chain: SB3's VecMonitor over a (channel-last) ProcgenVecEnv
    assert type(env) is VecMonitor and type(env.venv) is ProcgenVecEnv and not env.venv.channels_first
    assert env.num_envs == 3
    assert env.venv.procgen_kwargs["num_levels"] == 5 and env.venv.procgen_kwargs["start_level"] == 7
    env.reset()
    for _ in range(5):
        env.step(np.zeros(3, dtype=np.int64))
    env.close()
    # One monitor file for all envs, where the zoo logs (the probe's empty file is replaced)
    assert sorted(os.listdir(tmp_path)) == ["0.monitor.csv"]
    assert "t_start" in (tmp_path / "0.monitor.csv").read_text().splitlines()[0]

    # Other envs: the fallback class (by default the zoo's enjoy choice: SubprocVecEnv for several envs)
    env = make_vec_env("CartPole-v1", n_envs=1, vec_env_cls=factory)  # type: ignore[arg-type]
    assert isinstance(env, DummyVecEnv)
    env.close()
    env = make_vec_env("CartPole-v1", n_envs=2, vec_env_cls=vec_env.ProcgenVecEnvFactory(DummyVecEnv))  # type: ignore[arg-type]
    assert isinstance(env, DummyVecEnv)
    env.close()
    # Extra gymnasium wrappers: single envs
    with pytest.warns(UserWarning, match="DummyVecEnv"):
        env = make_vec_env(
            "procgen/maze-v0",
            n_envs=2,
            wrapper_class=gym.wrappers.RecordEpisodeStatistics,
            vec_env_cls=factory,  # type: ignore[arg-type]
        )
    assert isinstance(env, DummyVecEnv)
    env.close()


def test_dict_cartpole():
    env = gym.make(DICT_CARTPOLE_ID)
    observation, _ = env.reset(seed=0)
    assert set(observation) == {"cart", "pole"} and env.observation_space.contains(observation)
    env.close()


def test_optuna_sampler():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    env = DummyVecEnv([lambda: gym.make("CartPole-v1")] * 2)
    for _ in range(8):
        trial = study.ask()
        hyperparams = zoo.sample_ppg_params(trial, n_actions=0, n_envs=2, additional_args={})
        assert hyperparams["batch_size"] <= hyperparams["n_steps"] * 2
        converted = zoo.convert_ppg_params(trial.params)
        assert converted["policy_kwargs"] == hyperparams["policy_kwargs"]
        # Every sampled configuration is a valid PPG (aux minibatch no larger than the aux buffer)
        hyperparams["aux_batch_rollouts"] = min(4, hyperparams["n_policy_iters"] * 2)
        PPG("MlpPolicy", env, device="cpu", **hyperparams)
        study.tell(trial, 0.0)
    env.close()


def test_run_zoo_restores_sys_argv():
    saved_argv = list(sys.argv)
    with pytest.raises(ValueError, match="Unknown zoo command 'plot'"):
        zoo.run_zoo("plot", [])
    # The zoo reads sys.argv; it is restored even when the zoo fails (here: an unknown algorithm)
    with pytest.raises(SystemExit):
        zoo.run_zoo("train", ["--algo", "not-an-algo", "--env", "CartPole-v1"])
    assert sys.argv == saved_argv


def test_run_zoo_puts_back_the_zoos_registries(monkeypatch):
    """The zoo's registries hold PPG's entries during a run of the command line only (regression: they stayed)."""
    import rl_zoo3.train
    from rl_zoo3 import hyperparams_opt
    from rl_zoo3.exp_manager import ExperimentManager
    from rl_zoo3.utils import ALGOS

    before = object()
    monkeypatch.setitem(ALGOS, "ppg", before)
    monkeypatch.delitem(hyperparams_opt.HYPERPARAMS_SAMPLER, "ppg", raising=False)
    monkeypatch.setattr(ExperimentManager, "default_vec_env_cls", None)
    monkeypatch.setattr(rl_zoo3.train, "ExperimentManager", ExperimentManager)
    seen = {}

    def train():
        seen["algo"], seen["manager"] = ALGOS["ppg"], rl_zoo3.train.ExperimentManager

    monkeypatch.setattr(rl_zoo3.train, "train", train)
    zoo.run_zoo("train", [], keep_checkpoints=2)
    assert seen["algo"] is PPG and seen["manager"].keywords == {"keep_checkpoints": 2}
    assert ALGOS["ppg"] is before and "ppg" not in hyperparams_opt.HYPERPARAMS_SAMPLER
    assert ExperimentManager.default_vec_env_cls is None and rl_zoo3.train.ExperimentManager is ExperimentManager


def test_missing_zoo_message(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rl_zoo3", None)
    for main in (train.main, enjoy.main):
        with pytest.raises(SystemExit) as exc_info:
            main(["--env", "CartPole-v1"])
        message = str(exc_info.value.code)
        assert '`pip install -e ".[zoo]"` in the sb3-ppg folder' in message and "rl_zoo3" in message
        assert "\n" not in message


# ----------------------------------------------------------------------------------------------------------------------
# End to end through the command line entry points


def test_train_enjoy_cartpole(tmp_path: Path, capsys):
    train.main(
        [
            "--env",
            "CartPole-v1",
            "-n",
            "512",
            "--eval-freq",
            "256",
            "--eval-episodes",
            "2",
            *run_folder_args(tmp_path),
            "-params",
            "n_envs:2",
            "n_steps:64",
            "batch_size:64",
            "n_policy_iters:2",
            "n_aux_epochs:1",
            "aux_batch_rollouts:2",
            "normalize:True",
        ]
    )
    run_folder = tmp_path / "ppg" / "CartPole-v1_1"
    model = PPG.load(run_folder / "CartPole-v1.zip", device="cpu")
    assert model.num_timesteps == 512 and model.n_aux_phases >= 1
    PPG.load(run_folder / "best_model.zip", device="cpu")
    VecNormalize.load(str(run_folder / "CartPole-v1" / "vecnormalize.pkl"), DummyVecEnv([lambda: gym.make("CartPole-v1")]))
    with np.load(run_folder / "evaluations.npz") as evaluations:
        assert list(evaluations["timesteps"]) == [256, 512]
    assert (run_folder / "CartPole-v1" / "config.yml").is_file()

    capsys.readouterr()
    enjoy.main(["--env", "CartPole-v1", "-f", str(tmp_path), "--no-render", "-n", "300", "--load-best", "--verbose", "1"])
    assert "Episode Reward" in capsys.readouterr().out


def test_train_enjoy_procgen(tmp_path: Path, capsys):
    train.main(
        [
            "--env",
            "procgen/starpilot-v0",
            "--preset",
            "easy",
            "-n",
            "128",
            "--eval-freq",
            "64",
            "--eval-episodes",
            "1",
            *run_folder_args(tmp_path),
            "--env-kwargs",
            "num_levels:10",
            "-params",
            *TINY_PARAMS,
        ]
    )
    run_folder = tmp_path / "ppg" / "procgen-starpilot-v0_1"
    model = PPG.load(run_folder / "procgen-starpilot-v0.zip", device="cpu")
    assert model.num_timesteps == 128 and model.n_aux_phases == 2
    assert model.policy.arch == "detach"
    PPG.load(run_folder / "best_model.zip", device="cpu")
    vec_normalize = VecNormalize.load(
        str(run_folder / "procgen-starpilot-v0" / "vecnormalize.pkl"), ProcgenVecEnv(1, "starpilot", distribution_mode="easy")
    )
    assert vec_normalize.gamma == 0.999
    with np.load(run_folder / "evaluations.npz") as evaluations:
        assert list(evaluations["timesteps"]) == [64, 128]
    # Native vec env: one VecMonitor file for the 2 training envs
    assert [path.name for path in run_folder.glob("*monitor.csv")] == ["0.monitor.csv"]
    # --env-kwargs set over the preset's env_kwargs, recorded where enjoy reads them
    for name in ("config.yml", "args.yml"):
        saved = run_folders.read_run_file(run_folder / "procgen-starpilot-v0" / name)
        assert saved["env_kwargs"] == {"distribution_mode": "easy", "num_levels": 10, "start_level": 0}

    capsys.readouterr()
    enjoy.main(["--env", "procgen/starpilot-v0", "-f", str(tmp_path), "-n", "20"])
    assert "Loading" in capsys.readouterr().out


def test_train_procgen_paper_preset(tmp_path: Path):
    train.main(
        [
            "--env",
            "procgen/coinrun-v0",
            "-n",
            "64",
            "--eval-freq",
            "-1",
            *run_folder_args(tmp_path, seed=1),
            "-params",
            *TINY_PARAMS,
        ]
    )
    run_folder = tmp_path / "ppg" / "procgen-coinrun-v0_1"
    model = PPG.load(run_folder / "procgen-coinrun-v0.zip", device="cpu")
    assert model.policy.arch == "dual" and model.max_grad_norm is None and model.n_aux_phases == 1
    vec_normalize = VecNormalize.load(
        str(run_folder / "procgen-coinrun-v0" / "vecnormalize.pkl"), ProcgenVecEnv(1, "coinrun", distribution_mode="hard")
    )
    # The paper's reward-normalization discount, while the RL discount stays 0.999
    assert vec_normalize.gamma == 0.99 and model.gamma == 0.999


def test_optimize_one_trial(tmp_path: Path):
    train.main(
        [
            "--env",
            "CartPole-v1",
            "-optimize",
            "--n-trials",
            "1",
            "--n-timesteps",
            "600",
            "--n-jobs",
            "1",
            "--sampler",
            "random",
            "--pruner",
            "none",
            "--n-evaluations",
            "1",
            "--eval-episodes",
            "2",
            "--no-optim-plots",
            *run_folder_args(tmp_path),
            "-params",
            "n_envs:1",
            "aux_batch_rollouts:1",
        ]
    )
    reports = glob.glob(str(tmp_path / "ppg" / "report_CartPole-v1_1-trials-600-random-none_*.csv"))
    assert len(reports) == 1
    trials = pd.read_csv(reports[0])
    assert list(trials["state"]) == ["COMPLETE"]
    assert "params_n_aux_epochs" in trials.columns


@pytest.mark.parametrize(
    "env_kwargs, eval_env_kwargs, train_options, eval_options",
    [
        # The preset's settings for both envs (the zoo evaluated with none: procgen's hard mode)
        (None, None, ("easy", 0), ("easy", 0)),
        # docs/command_line.md's generalization protocol with the easy preset: --env-kwargs completes the preset's
        # env_kwargs (the zoo replaced them: hard mode) and --eval-env-kwargs completes the training env's
        ({"num_levels": 200}, {"num_levels": 0}, ("easy", 200), ("easy", 0)),
    ],
)
def test_env_kwargs_complete_the_preset(tmp_path: Path, env_kwargs, eval_env_kwargs, train_options, eval_options):
    manager = zoo.make_experiment_manager(
        argparse.Namespace(),
        "ppg",
        "procgen/starpilot-v0",
        str(tmp_path),
        eval_freq=64,
        n_eval_episodes=1,
        hyperparams={"n_envs": 2, "n_steps": 16, "batch_size": 32, "n_policy_iters": 2, "aux_batch_rollouts": 2},
        env_kwargs=env_kwargs,
        eval_env_kwargs=eval_env_kwargs,
        seed=0,
        verbose=0,
        device="cpu",
        config=EASY_FILE,
    )
    model, saved_hyperparams = manager.setup_experiment()
    eval_env = next(callback.eval_env for callback in manager.callbacks if isinstance(callback, EvalCallback))
    for env, (mode, num_levels) in ((model.env, train_options), (eval_env, eval_options)):
        options = env.unwrapped.procgen_kwargs
        assert (options["distribution_mode"], options["num_levels"]) == (mode, num_levels)
        env.close()
    # config.yml describes the training env
    assert saved_hyperparams["env_kwargs"] == {"distribution_mode": "easy", "num_levels": train_options[1], "start_level": 0}


# ----------------------------------------------------------------------------------------------------------------------
# enjoy: which run it plays, and its errors


def make_runs(log_folder: Path, make_model, models: dict[int, tuple[str, ...]]) -> Path:
    """
    Run folders ``<log_folder>/ppg/CartPole-v1_<id>`` holding the given model files (a small PPG model; the zoo's
    ``enjoy`` needs nothing else of a CartPole run). A run without files is a run that failed before saving a model.
    """
    algo_folder = log_folder / "ppg"
    model = make_model("CartPole-v1")
    for run_id, names in models.items():
        (algo_folder / f"CartPole-v1_{run_id}").mkdir(parents=True)
        for name in names:
            model.save(algo_folder / f"CartPole-v1_{run_id}" / name)
    return algo_folder


def enjoy_argv(log_folder: Path, *options: str) -> list[str]:
    return ["--env", "CartPole-v1", "-f", str(log_folder), "--no-render", "-n", "10", "--verbose", "0", *options]


def test_enjoy_plays_the_newest_run_that_has_the_model(tmp_path: Path, make_model, capsys):
    """The newest run (3) failed before saving a model: the zoo alone would fail on it, enjoy takes run 2 and says so."""
    algo_folder = make_runs(tmp_path, make_model, {1: ("CartPole-v1.zip", "best_model.zip"), 2: ("CartPole-v1.zip",), 3: ()})
    enjoy.main(enjoy_argv(tmp_path))
    lines = capsys.readouterr().out.splitlines()
    # The first line says how many threads it uses (sb3_ppg.cli.threads)
    assert lines[0].startswith("torch and procgen threads: ")
    assert lines[1:3] == [
        f"Playing run {algo_folder / 'CartPole-v1_2'}, model CartPole-v1.zip; skipped the newer CartPole-v1_3: no "
        "CartPole-v1.zip (failed or unfinished runs?)",
        f"Loading {algo_folder / 'CartPole-v1_2' / 'CartPole-v1.zip'}",
    ]
    # --load-best: the newest run with a best model
    enjoy.main(enjoy_argv(tmp_path, "--load-best"))
    assert capsys.readouterr().out.splitlines()[1:3] == [
        f"Playing run {algo_folder / 'CartPole-v1_1'}, model best_model.zip; skipped the newer CartPole-v1_3, "
        "CartPole-v1_2: no best_model.zip (failed or unfinished runs?)",
        f"Loading {algo_folder / 'CartPole-v1_1' / 'best_model.zip'}",
    ]


def test_enjoy_without_a_model_fails_with_one_line(tmp_path: Path, make_model):
    """The command line: exit status 1 and a one-line error on stderr naming the runs and the fixes, no traceback."""
    algo_folder = make_runs(tmp_path, make_model, {1: (), 2: ()})
    command = [sys.executable, "-m", "sb3_ppg.enjoy", *enjoy_argv(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: no run of ppg on CartPole-v1 in {algo_folder}{os.sep} has a model CartPole-v1.zip (runs CartPole-v1_1, "
        "CartPole-v1_2: failed or unfinished?); --load-best plays the best model of a run that evaluated during "
        f"training; or train one with `python -m sb3_ppg.train --env CartPole-v1 -f {tmp_path}`"
    ]


def test_enjoy_errors_are_one_line(tmp_path: Path, make_model):
    # No run at all
    with pytest.raises(SystemExit) as error:
        enjoy.main(enjoy_argv(tmp_path))
    assert error.value.code == (
        f"error: no run of ppg on CartPole-v1 in {tmp_path / 'ppg'}{os.sep} (no CartPole-v1_<id> folder): train one with "
        f"`python -m sb3_ppg.train --env CartPole-v1 -f {tmp_path}`, or give the log folder it was trained into with -f"
    )
    # The zoo's own errors (here --exp-id of a run that does not exist): one line, or the traceback with --traceback
    make_runs(tmp_path, make_model, {1: ("CartPole-v1.zip",)})
    with pytest.raises(SystemExit) as error:
        enjoy.main(enjoy_argv(tmp_path, "--exp-id", "5"))
    assert error.value.code == (
        f"error: AssertionError: The {tmp_path / 'ppg' / 'CartPole-v1_5'} folder was not found (--traceback shows where)"
    )
    with pytest.raises(AssertionError, match="CartPole-v1_5 folder was not found"):
        enjoy.main(enjoy_argv(tmp_path, "--exp-id", "5", "--traceback"))


def test_enjoy_plays_the_runs_own_checkpoints(tmp_path: Path, make_model, capsys):
    """
    --load-checkpoint N and --load-last-checkpoint play the run's own checkpoints (checkpoints/ppg_<N>_steps/): on
    main enjoy looked for the zoo's rl_model_<N>_steps.zip only and never found them. A missing one names those there.
    """
    algo_folder = make_runs(tmp_path, make_model, {1: ("CartPole-v1.zip",), 2: ()})
    run_folder = algo_folder / "CartPole-v1_1"
    model = make_model("CartPole-v1")
    model.learn(32, callback=PPGCheckpointCallback(16, str(run_folder / "checkpoints"), name_prefix="ppg"))
    (run_folder / "checkpoints" / "ppg_48_steps").mkdir()  # an incomplete checkpoint (no manifest): not played
    for options, steps in ((("--load-checkpoint", "16"), 16), (("--load-last-checkpoint",), 32)):
        enjoy.main(enjoy_argv(tmp_path, *options))
        model_path = run_folder / "checkpoints" / f"ppg_{steps}_steps" / "model.zip"
        assert capsys.readouterr().out.splitlines()[1:3] == [
            f"Playing run {run_folder}, model {Path('checkpoints', f'ppg_{steps}_steps', 'model.zip')}; skipped the "
            f"newer CartPole-v1_2: no {'checkpoint 16' if steps == 16 else 'checkpoint'} (failed or unfinished runs?)",
            f"Loading {model_path}",
        ]
    with pytest.raises(SystemExit) as error:
        enjoy.main(enjoy_argv(tmp_path, "--load-checkpoint", "192"))
    assert error.value.code == (
        f"error: no run of ppg on CartPole-v1 in {algo_folder}{os.sep} has a checkpoint 192 (CartPole-v1_1: checkpoints "
        "at steps 16, 32; CartPole-v1_2: no checkpoint); train with --save-freq N to write checkpoints into "
        "<run folder>/checkpoints/"
    )
    with pytest.raises(SystemExit) as error:  # a run given by --exp-id: the zoo's lookup, with the same list
        enjoy.main(enjoy_argv(tmp_path, "--load-checkpoint", "192", "--exp-id", "1"))
    assert error.value.code == (
        f"error: ValueError: The run {run_folder} has no checkpoint 192 (checkpoints at steps 16, 32) "
        "(--traceback shows where)"
    )


@pytest.mark.slow
def test_enjoy_records_a_video(tmp_path: Path, capsys):
    """python -m sb3_ppg.enjoy --record: the zoo's record_video on the run enjoy picks, an mp4 of -n steps."""
    pytest.importorskip("moviepy")
    train.main(
        ["--env", "procgen/starpilot-v0", "--preset", "easy", "-n", "64", "--seed", "0", "--device", "cpu",
         "-f", str(tmp_path), "--verbose", "0", "--eval-freq", "-1",
         "-params", "n_envs:2", "n_steps:16", "batch_size:16", "n_policy_iters:2", "n_aux_epochs:1", "aux_batch_rollouts:2"]
    )  # fmt: skip
    enjoy.main(["--env", "procgen/starpilot-v0", "-f", str(tmp_path), "-n", "8", "--record", "-o", str(tmp_path / "videos")])
    assert "Playing run" in capsys.readouterr().out
    videos = glob.glob(str(tmp_path / "videos" / "*.mp4"))
    assert len(videos) == 1 and os.path.getsize(videos[0]) > 0
