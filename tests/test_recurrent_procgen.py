"""RecurrentPPG on Procgen: the packaged hyperparameters, the command line in distribution_mode="memory", the benchmark."""

from pathlib import Path

import pytest
import yaml
from benchmark_scripts import load_script
from helpers import run_folder_args

from sb3_ppg import RecurrentPPG
from sb3_ppg.cli import arguments, run_folders, train
from sb3_ppg.ppg_recurrent import ProcgenCnnLstmPolicy
from sb3_ppg.procgen import PROCGEN_GAMES

RECURRENT_FILE = str(arguments.HYPERPARAMS_DIR / "recurrent_ppg.yml")
PROCGEN_IDS = [f"procgen/{game}-v0" for game in PROCGEN_GAMES]
#: The settings of PPG's paper entries (ppg.yml) that differ for RecurrentPPG's: its policy, 64 envs instead of 256
#: (one worker of the paper's four) and the minibatch sizes that follow, whole env rollouts as before
SCALED_KEYS = {"n_envs", "policy", "policy_kwargs", "batch_size", "aux_batch_rollouts", "policy_minibatches"}

pytestmark = pytest.mark.usefixtures("registered_zoo")


def load_yaml(path: str) -> dict:
    with open(path) as file_handler:
        return yaml.safe_load(file_handler)


def test_packaged_procgen_entries():
    """Every Procgen game has RecurrentPPG's entry: PPG's paper settings, the LSTM policy, whole env rollouts."""
    recurrent, paper = load_yaml(RECURRENT_FILE), load_yaml(arguments.hyperparams_file("paper"))
    assert set(PROCGEN_IDS) <= set(recurrent)
    entry = recurrent["procgen/bigfish-v0"]
    for env_id in PROCGEN_IDS:
        assert recurrent[env_id] == entry
    assert entry["policy"] == "ProcgenCnnLstm"
    assert entry["policy_kwargs"] == "dict(arch='dual', lstm_hidden_size=256, enable_critic_lstm=True)"
    assert (entry["n_envs"], entry["n_steps"], entry["n_policy_iters"], entry["n_aux_epochs"]) == (64, 256, 32, 6)
    # 8 policy minibatches of 8 whole env rollouts, 4 rollouts per auxiliary minibatch (the paper's per worker)
    assert entry["batch_size"] == 8 * entry["n_steps"] and entry["aux_batch_rollouts"] == 4
    paper_entry = paper["procgen/bigfish-v0"]
    assert {key: value for key, value in entry.items() if key not in SCALED_KEYS} == {
        key: value for key, value in paper_entry.items() if key not in SCALED_KEYS
    }


def memory_mode_args(game: str, tmp_path: Path, *params: str) -> list[str]:
    """The command line of a 32-step RecurrentPPG run on ``game`` in distribution_mode="memory", 2 envs x 16 steps."""
    return [
        *("--algo", "recurrent_ppg", "--env", f"procgen/{game}-v0", "-n", "32", *run_folder_args(tmp_path)),
        *("--env-kwargs", "distribution_mode:'memory'", "-params", "n_envs:2", "n_steps:16", "batch_size:16", *params),
    ]


def test_train_procgen_memory_mode(tmp_path: Path):
    """--algo recurrent_ppg on a Procgen game in distribution_mode="memory": trains, with its aux phase, and saves."""
    train.main(
        memory_mode_args(
            "maze",
            tmp_path,
            "n_policy_iters:1",
            "n_aux_epochs:1",
            "aux_batch_rollouts:2",
            "policy_kwargs:dict(lstm_hidden_size=16, enable_critic_lstm=True)",
        )
    )
    run_folder = tmp_path / "recurrent_ppg" / "procgen-maze-v0_1"
    model = RecurrentPPG.load(run_folder / "procgen-maze-v0.zip", device="cpu")
    assert model.num_timesteps == 32 and model.n_aux_phases == 1
    assert isinstance(model.policy, ProcgenCnnLstmPolicy) and model.policy.arch == "dual"
    assert model.policy.lstm_actor.hidden_size == 16 and model.policy.lstm_critic.hidden_size == 16
    # The packaged settings under the overrides
    assert (model.n_epochs, model.ent_coef, model.normalize_reward, model.separate_aux_optimizer) == (1, 0.01, True, True)
    for name in ("config.yml", "args.yml"):
        saved = run_folders.read_run_file(run_folder / "procgen-maze-v0" / name)
        assert saved["env_kwargs"] == {"distribution_mode": "memory", "num_levels": 0, "start_level": 0}


def test_train_procgen_memory_mode_needs_a_memory_game(tmp_path: Path):
    """A game without the memory mode is refused with procgen's list of those that have it."""
    with pytest.raises(SystemExit, match="starpilot does not support distribution_mode='memory'"):
        train.main(memory_mode_args("starpilot", tmp_path))


def test_benchmark_scales_the_packaged_settings(tmp_path: Path):
    """benchmarks/recurrent_procgen.py: the packaged entry, its minibatches scaled to the envs; its report."""
    script = load_script("recurrent_procgen")
    kwargs, policy_kwargs = script.packaged_settings("miner", 64)
    assert (kwargs["batch_size"], kwargs["aux_batch_rollouts"], kwargs["n_policy_iters"]) == (2048, 4, 32)
    assert policy_kwargs == dict(arch="dual", lstm_hidden_size=256, enable_critic_lstm=True)
    assert not {"n_envs", "policy", "env_kwargs", "n_timesteps"} & set(kwargs)
    for n_envs, batch_size, aux_batch_rollouts in ((16, 512, 1), (8, 256, 1), (2, 256, 1)):
        kwargs, _ = script.packaged_settings("miner", n_envs)
        assert (kwargs["batch_size"], kwargs["aux_batch_rollouts"]) == (batch_size, aux_batch_rollouts)
    record = dict(algorithm="PPG", seed=3, returns=[float(i) for i in range(50)], timesteps=1000, seconds=4.0)
    row = script.summary(record)
    # Fewer than 200 episodes: the two halves
    assert (row["compared"], row["first"], row["last"], row["steps_per_second"]) == (25, 12.0, 37.0, 250.0)
    record["returns"] = [0.0] * 100 + [1.0] * 150 + [2.0] * 100
    assert (script.summary(record)["first"], script.summary(record)["last"]) == (0.0, 2.0)
    script.write(record, str(tmp_path / "ppg.json"))
    assert "| PPG | 3 | 1,000 | 350 | 100 | 0.00 | 2.00 | 250.0 | no |" in script.report([str(tmp_path / "ppg.json")])
