"""
``python -m sb3_ppg.push_to_hub`` / ``load_from_hub``, offline (these machines cannot reach the Hub): a run folder is
packaged into the repository folder the Hub would receive, the upload is called with the right arguments on a mocked
Hugging Face client (so nothing is sent), and ``load_from_hub`` rebuilds a run from that folder.
"""

import json
import zipfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import yaml
from helpers import run_folder_args

from sb3_ppg import PPG, MaskablePPG
from sb3_ppg.cli import enjoy, hub, train

pytestmark = pytest.mark.slow  # training runs through the command line


def push_offline(monkeypatch, argv: list[str]) -> mock.MagicMock:
    """
    Run ``push_to_hub`` with the Hugging Face client replaced by a mock (and the Hub's offline mode on, so that any
    other request would fail), and return the mock client.
    """
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with mock.patch("huggingface_hub.HfApi") as client_class:
        client_class.return_value.create_repo.return_value = "https://huggingface.co/me/repo"
        hub.main("push_to_hub", argv)
    return client_class.return_value


def assert_uploaded(client: mock.MagicMock, repo_id: str, repo_folder: Path) -> None:
    """The client created the repository and uploaded the folder, and did nothing else."""
    assert [call[0] for call in client.mock_calls] == ["create_repo", "upload_folder"]
    client.create_repo.assert_called_once_with(repo_id=repo_id, private=False, exist_ok=True)
    client.upload_folder.assert_called_once_with(repo_id=repo_id, folder_path=str(repo_folder), commit_message="first")


def read_card(repo_folder: Path) -> tuple[dict, str]:
    """The model card's metadata (the YAML header) and its text."""
    _, header, text = (repo_folder / "README.md").read_text().split("---\n", 2)
    return yaml.safe_load(header), text


def test_push_and_load_a_procgen_run(tmp_path: Path, monkeypatch, capsys):
    """
    A Procgen run (it renders frames) is packaged with the model zip, its files, the run's settings, the monitor and
    evaluation files, an evaluation, a video and a model card; load_from_hub turns that folder back into a run that
    loads and plays.
    """
    logs = tmp_path / "logs"
    params = ["n_envs:2", "n_steps:16", "batch_size:32", "n_policy_iters:1", "n_aux_epochs:1", "aux_batch_rollouts:1"]
    common = ["--env", "procgen/starpilot-v0", "--num-threads", "1"]
    evaluations = ["--eval-freq", "32", "--eval-episodes", "1"]
    train.main([*common, "--preset", "easy", "-n", "64", *evaluations, *run_folder_args(logs), "-params", *params])
    run_folder = logs / "ppg" / "procgen-starpilot-v0_1"
    trained = PPG.load(run_folder / "procgen-starpilot-v0.zip", device="cpu")

    local = tmp_path / "hub"
    argv = [*common, "-f", str(logs), "-orga", "me", "-m", "first", "--local-repo-path", str(local)]
    client = push_offline(monkeypatch, [*argv, "-n", "20", "--n-eval-episodes", "1", "--device", "cpu"])
    repo_folder = local / "ppg-procgen-starpilot-v0"
    assert_uploaded(client, "me/ppg-procgen-starpilot-v0", repo_folder)

    files = {path.name for path in repo_folder.iterdir()}
    expected = {"ppg-procgen-starpilot-v0.zip", "ppg-procgen-starpilot-v0", "config.yml", "args.yml", "env_kwargs.yml"}
    expected |= {"vec_normalize.pkl", "train_eval_metrics.zip", "results.json", "replay.mp4", "README.md", ".gitattributes"}
    assert files == expected
    assert {"data", "policy.pth"} <= {path.name for path in (repo_folder / "ppg-procgen-starpilot-v0").iterdir()}
    assert (repo_folder / "replay.mp4").stat().st_size > 1000
    with zipfile.ZipFile(repo_folder / "train_eval_metrics.zip") as archive:
        assert {"evaluations.npz", "0.monitor.csv"} <= set(archive.namelist())
    assert yaml.safe_load((repo_folder / "env_kwargs.yml").read_text())["distribution_mode"] == "easy"
    results = json.loads((repo_folder / "results.json").read_text())
    assert results["n_eval_episodes"] == 1 and results["is_deterministic"] is False  # Procgen: sampled actions
    metadata, text = read_card(repo_folder)
    assert "procgen/starpilot-v0" in metadata["tags"] and metadata["library_name"] == "stable-baselines3"
    metric = metadata["model-index"][0]["results"][0]["metrics"][0]
    assert (
        metric["type"] == "mean_reward" and metric["value"] == f"{results['mean_reward']:.2f} +/- {results['std_reward']:.2f}"
    )
    assert "'n_policy_iters': 1" in text and "python -m sb3_ppg.load_from_hub --algo ppg" in text

    # load_from_hub downloads each file with huggingface_hub.hf_hub_download: here, from the repository folder
    downloads = []

    def hf_hub_download(repo_id: str, filename: str, **kwargs) -> str:
        downloads.append((repo_id, filename))
        return str(repo_folder / filename)

    monkeypatch.setenv("TRUST_REMOTE_CODE", "True")
    with mock.patch("huggingface_hub.hf_hub_download", hf_hub_download):
        hub.main("load_from_hub", ["--env", "procgen/starpilot-v0", "-f", str(tmp_path / "downloaded"), "-orga", "me"])
    assert {name for _, name in downloads} >= {"ppg-procgen-starpilot-v0.zip", "config.yml", "vec_normalize.pkl"}
    assert {repo for repo, _ in downloads} == {"me/ppg-procgen-starpilot-v0"}
    downloaded = tmp_path / "downloaded" / "ppg" / "procgen-starpilot-v0_1"
    loaded = PPG.load(downloaded / "procgen-starpilot-v0.zip", device="cpu")
    for name, parameter in trained.policy.state_dict().items():
        np.testing.assert_array_equal(loaded.policy.state_dict()[name].numpy(), parameter.numpy())
    capsys.readouterr()
    enjoy.main([*common, "-f", str(tmp_path / "downloaded"), "-n", "50", "--verbose", "1"])
    assert f"Playing run {downloaded}" in capsys.readouterr().out


def test_push_a_maskable_run(tmp_path: Path, monkeypatch, capsys):
    """
    --algo maskable_ppg (which the zoo's push_to_hub refuses): the evaluation plays with the env's masks (only the
    right action valid: every episode scores 100), and an env that renders no frames gets no video, saying so.
    """
    env_id = "sb3_ppg/InvalidActionEnvDiscrete-v0"
    logs = tmp_path / "logs"
    only_right_action = ["--env-kwargs", "n_invalid_actions:69"]
    common = ["--algo", "maskable_ppg", "--env", env_id, "--num-threads", "1"]
    train.main([*common, "-n", "128", *run_folder_args(logs), "-params", "n_steps:64", "n_policy_iters:2", *only_right_action])
    local = tmp_path / "hub"
    argv = [*common, "-f", str(logs), "-orga", "me", "-name", "masked", "-m", "first", "--local-repo-path", str(local)]
    client = push_offline(monkeypatch, [*argv, "--n-eval-episodes", "3", "--device", "cpu"])
    repo_folder = local / "masked"
    assert_uploaded(client, "me/masked", repo_folder)
    assert "No video: the env renders no frames" in capsys.readouterr().out
    assert not (repo_folder / "replay.mp4").exists() and not (repo_folder / "vec_normalize.pkl").exists()
    MaskablePPG.load(repo_folder / "maskable_ppg-sb3_ppg-InvalidActionEnvDiscrete-v0.zip", device="cpu")
    results = json.loads((repo_folder / "results.json").read_text())
    assert results["mean_reward"] == 100.0 and results["is_deterministic"] is True
    metadata, text = read_card(repo_folder)
    assert metadata["model-index"][0]["name"] == "MaskablePPG" and "--algo maskable_ppg" in text


def test_push_without_a_model_says_so(tmp_path: Path, monkeypatch):
    argv = ["--env", "CartPole-v1", "-f", str(tmp_path), "-orga", "me", "--local-repo-path", str(tmp_path / "hub")]
    with pytest.raises(SystemExit, match="no run of ppg on CartPole-v1"):
        push_offline(monkeypatch, argv)
    assert not (tmp_path / "hub").exists()
