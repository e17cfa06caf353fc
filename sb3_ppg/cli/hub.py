"""
Models on the Hugging Face Hub, as rl-zoo3 users share them: ``python -m sb3_ppg.push_to_hub`` packages a run folder
(the model, its hyperparameters and env settings, an evaluation, a video where the env renders, a model card) into the
repository folder the Hub receives, then uploads that folder; ``python -m sb3_ppg.load_from_hub`` downloads such a
repository into a log folder, as a run that ``python -m sb3_ppg.enjoy`` plays. Both take rl-zoo3's options and accept
``--algo ppg`` and ``--algo maskable_ppg``, which the zoo's own commands refuse (see docs/command_line.md).
"""

import argparse
import datetime
import glob
import json
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from pprint import pformat
from typing import Any

import numpy as np
import yaml
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecEnv, VecVideoRecorder

from sb3_ppg.cli.algorithms import PPG_ALGORITHMS
from sb3_ppg.cli.enjoy import NoModelError, find_model
from sb3_ppg.cli.run_folders import read_run_file, zoo_reads_run_files_safely
from sb3_ppg.cli.vec_env import is_procgen_env_id
from sb3_ppg.cli.zoo import ZooNotInstalledError, command_line_threads, import_zoo, zoo_registered
from sb3_ppg.ppg import PPG
from sb3_ppg.ppg_mask import MaskablePPG, MaskedPlayer

#: The video of the agent in the repository folder
VIDEO_NAME = "replay.mp4"
#: The evaluation in the repository folder (huggingface_sb3's name and fields)
RESULTS_NAME = "results.json"


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that name a model, as rl-zoo3's: ``--algo``, ``--env``, ``-f``, ``--exp-id``, ``-orga``, ``-name``."""
    parser.add_argument("--env", help="Environment ID", required=True)
    parser.add_argument("-f", "--folder", help="Log folder", required=True)
    parser.add_argument("--algo", help="Algorithm", default="ppg", choices=list(PPG_ALGORITHMS))
    parser.add_argument("--exp-id", help="Experiment ID (default: 0: latest, -1: no exp folder)", default=0, type=int)
    parser.add_argument("-name", "--repo-name", help="Hub repository name (default: '<algo>-<env name>')")


def push_parser() -> argparse.ArgumentParser:
    """The options of ``python -m sb3_ppg.push_to_hub`` (rl-zoo3's ``push_to_hub`` options)."""
    parser = argparse.ArgumentParser(prog="python -m sb3_ppg.push_to_hub", description=__doc__.split("\n\n")[0])
    add_run_arguments(parser)
    parser.add_argument("-orga", "--organization", help="Hub user or organization", required=True)
    parser.add_argument("-m", "--commit-message", help="Commit message", default="Initial commit")
    parser.add_argument("-n", "--n-timesteps", help="Steps of the video", default=1000, type=int)
    parser.add_argument("--n-eval-episodes", help="Episodes of the evaluation", default=10, type=int)
    parser.add_argument("--n-envs", help="Evaluation envs", default=1, type=int)
    parser.add_argument("--no-render", action="store_true", default=False, help="No video")
    parser.add_argument("--deterministic", action="store_true", default=False, help="Deterministic actions")
    parser.add_argument("--stochastic", action="store_true", default=False, help="Sampled actions (Procgen's default)")
    parser.add_argument("--load-best", action="store_true", default=False, help="The run's best model")
    parser.add_argument("--load-checkpoint", type=int, help="The run's checkpoint of this many steps")
    parser.add_argument("--load-last-checkpoint", action="store_true", default=False, help="The run's last checkpoint")
    parser.add_argument("--device", default="auto", help="PyTorch device of the evaluation")
    parser.add_argument("--seed", default=0, type=int, help="Seed of the evaluation")
    parser.add_argument("--num-threads", type=int, default=None, help="torch threads (default: the idle CPUs')")
    parser.add_argument("--local-repo-path", default="hub", help="Where the repository folder is written")
    return parser


def load_parser() -> argparse.ArgumentParser:
    """The options of ``python -m sb3_ppg.load_from_hub`` (rl-zoo3's ``load_from_hub`` options)."""
    parser = argparse.ArgumentParser(prog="python -m sb3_ppg.load_from_hub", description=__doc__.split("\n\n")[0])
    add_run_arguments(parser)
    parser.add_argument("-orga", "--organization", help="Hub user or organization", default="sb3")
    parser.add_argument("--force", action="store_true", default=False, help="Overwrite the run folder if it exists")
    return parser


def find_run(
    folder: str, algo: str, env_name: str, exp_id: int, load_best: bool, checkpoint: int | None, last: bool
) -> tuple[str, str]:
    """
    The run folder and model file that ``push_to_hub`` shares: with ``exp_id`` 0, the newest run that has the model.

    :return: ``(run folder, model path)``
    :raises NoModelError: where no run has it
    """
    algo_folder = os.path.join(folder, algo)
    if exp_id > 0:
        run_ids = [exp_id]
    elif exp_id < 0:
        run_ids = [-1]
    else:
        names = glob.glob(os.path.join(glob.escape(algo_folder), f"{glob.escape(env_name)}_*"))
        suffixes = [os.path.basename(name)[len(env_name) + 1 :] for name in names]
        run_ids = sorted((int(suffix) for suffix in suffixes if suffix.isdigit()), reverse=True)
    for run_id in run_ids:
        run_folder = algo_folder if run_id < 0 else os.path.join(algo_folder, f"{env_name}_{run_id}")
        model = find_model(run_folder, env_name, load_best, checkpoint, last)
        if model is not None:
            return run_folder, model
    raise NoModelError(f"no run of {algo} on {env_name} in {algo_folder}{os.sep} has the model asked for (runs: {run_ids})")


def make_model_card(
    algo: str,
    algo_class: str,
    repo_id: str,
    env_id: str,
    evaluation: dict[str, Any],
    hyperparams: dict[str, Any],
    env_kwargs: dict[str, Any],
) -> tuple[str, dict[str, Any]]:
    """
    The repository's README.md: the model card's text and its metadata (tags and the evaluation, in the Hub's
    model-index format, as huggingface_sb3 writes them).

    :return: ``(text, metadata)``
    """
    from huggingface_hub.repocard import metadata_eval_result

    mean, std = evaluation["mean_reward"], evaluation["std_reward"]
    metadata = {
        "library_name": "stable-baselines3",
        "tags": [env_id, "deep-reinforcement-learning", "reinforcement-learning", "stable-baselines3", "sb3-ppg"],
        **metadata_eval_result(
            model_pretty_name=algo_class,
            task_pretty_name="reinforcement-learning",
            task_id="reinforcement-learning",
            metrics_pretty_name="mean_reward",
            metrics_id="mean_reward",
            metrics_value=f"{mean:.2f} +/- {std:.2f}",
            dataset_pretty_name=env_id,
            dataset_id=env_id,
        ),
    }
    actions = "deterministic" if evaluation["is_deterministic"] else "sampled"
    organization = repo_id.split("/")[0]
    text = f"""
# **{algo_class}** agent playing **{env_id}**

A **{algo_class}** (Phasic Policy Gradient) agent trained with sb3-ppg (PPG for
[Stable-Baselines3](https://github.com/DLR-RM/stable-baselines3)) and the
[RL Zoo](https://github.com/DLR-RM/rl-baselines3-zoo).

Mean return over {evaluation["n_eval_episodes"]} episodes ({actions} actions): {mean:.2f} +/- {std:.2f} (standard
deviation).

## Usage (with sb3-ppg's command line)

```bash
# The download loads pickled objects: the zoo's download function asks for TRUST_REMOTE_CODE=True
TRUST_REMOTE_CODE=True python -m sb3_ppg.load_from_hub --algo {algo} --env {env_id} -orga {organization} -f logs/
python -m sb3_ppg.enjoy --algo {algo} --env {env_id} -f logs/
```

## Training

```bash
python -m sb3_ppg.train --algo {algo} --env {env_id} -f logs/
python -m sb3_ppg.push_to_hub --algo {algo} --env {env_id} -f logs/ -orga {organization}
```

## Hyperparameters

```python
{pformat(hyperparams)}
```
"""
    if env_kwargs:
        text += f"""
## Environment arguments

```python
{pformat(env_kwargs)}
```
"""
    return text, metadata


def has_rgb_array(env_id: str) -> bool:
    """Whether the env class of a gymnasium id lists ``render_mode="rgb_array"`` (the video's frames)."""
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    entry_point = gymnasium.spec(env_id).entry_point
    creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    return "rgb_array" in getattr(creator, "metadata", {}).get("render_modes", ())


def renders_frames(env: VecEnv) -> bool:
    """
    Whether ``env`` renders frames for a video (``render_mode="rgb_array"`` and what rendering needs installed, e.g.
    pygame for the classic-control envs); says why where it does not.
    """
    import gymnasium

    if env.render_mode != "rgb_array":
        print(f"No video: the env renders no frames (render_mode={env.render_mode!r})")
        return False
    env.reset()
    try:
        frames = env.get_images()
    except (gymnasium.error.DependencyNotInstalled, ImportError) as error:
        print(f"No video: the env cannot render ({error})")
        return False
    return len(frames) > 0 and all(frame is not None for frame in frames)


def record_video(player: Any, env: VecEnv, video_length: int, deterministic: bool, path: Path) -> bool:
    """
    Record ``video_length`` steps of the agent to ``path`` with SB3's ``VecVideoRecorder`` (which closes ``env``).

    :param player: What acts (a model, or a :class:`~sb3_ppg.ppg_mask.MaskedPlayer`)
    :return: Whether a video was written
    """
    with tempfile.TemporaryDirectory() as folder:
        recorder = VecVideoRecorder(env, folder, lambda step: step == 0, video_length=video_length, name_prefix="replay")
        observations = recorder.reset()
        for _ in range(video_length + 1):
            actions, _ = player.predict(observations, deterministic=deterministic)
            observations, _, _, _ = recorder.step(actions)
        recorder.close()
        videos = glob.glob(os.path.join(folder, "*.mp4"))
        if videos:
            shutil.move(videos[0], path)
    return path.is_file()


def package_run(
    model: PPG,
    env: VecEnv,
    run_folder: str,
    algo: str,
    env_id: str,
    repo_folder: Path,
    repo_id: str,
    hyperparams: dict[str, Any],
    env_kwargs: dict[str, Any],
    n_eval_episodes: int = 10,
    deterministic: bool = True,
    video_length: int = 1000,
) -> dict[str, Any]:
    """
    Write the repository folder of a run, in rl-zoo3's layout (what ``load_from_hub`` reads back): the model zip
    (``<algo>-<env name>.zip``) and its unzipped files, ``config.yml``, ``args.yml``, ``env_kwargs.yml``,
    ``vec_normalize.pkl`` (where the run normalized), ``train_eval_metrics.zip`` (evaluations and monitor files), the
    evaluation (``results.json``), a video (``replay.mp4``, where ``env`` renders frames) and the model card
    (``README.md``). ``env`` is closed.

    :param model: The model to share
    :param env: The evaluation env (``render_mode="rgb_array"`` for a video)
    :param run_folder: The run folder the model comes from (``<log folder>/<algo>/<env name>_<id>``)
    :param repo_id: ``<organization>/<repository>``
    :param hyperparams: The run's hyperparameters (its ``config.yml``), shown in the model card
    :param env_kwargs: The env's keyword arguments
    :param video_length: Steps of the video (0: none)
    :return: The evaluation (``results.json``'s content)
    """
    from huggingface_hub.repocard import metadata_save
    from huggingface_sb3 import EnvironmentName, ModelName

    env_name = EnvironmentName(env_id)
    model_name = ModelName(algo, env_name)
    repo_folder.mkdir(parents=True, exist_ok=True)
    model.save(repo_folder / model_name.filename)
    with zipfile.ZipFile(repo_folder / model_name.filename) as archive:
        archive.extractall(repo_folder / model_name)
    settings_folder = Path(run_folder) / env_name
    for name in ("config.yml", "args.yml"):
        shutil.copy(settings_folder / name, repo_folder / name)
    if (settings_folder / "vecnormalize.pkl").is_file():
        shutil.copy(settings_folder / "vecnormalize.pkl", repo_folder / "vec_normalize.pkl")
    with open(repo_folder / "env_kwargs.yml", "w") as file:
        yaml.safe_dump(env_kwargs, file)
    with zipfile.ZipFile(repo_folder / "train_eval_metrics.zip", "w") as archive:
        for path in sorted(glob.glob(os.path.join(glob.escape(run_folder), "*.csv"))) + glob.glob(
            os.path.join(glob.escape(run_folder), "evaluations.npz")
        ):
            archive.write(path, arcname=os.path.basename(path))
    with open(repo_folder / ".gitattributes", "a+") as file:
        file.seek(0)
        if "*.mp4" not in file.read():
            file.write("*.mp4 filter=lfs diff=lfs merge=lfs -text\n")

    player = MaskedPlayer(model, env) if isinstance(model, MaskablePPG) else model
    returns, _ = evaluate_policy(
        player, env, n_eval_episodes=n_eval_episodes, deterministic=deterministic, return_episode_rewards=True
    )
    evaluation = {
        "mean_reward": float(np.mean(returns)),
        "std_reward": float(np.std(returns)),
        "is_deterministic": deterministic,
        "n_eval_episodes": n_eval_episodes,
        "eval_datetime": datetime.datetime.now().isoformat(),
    }
    with open(repo_folder / RESULTS_NAME, "w") as file:
        json.dump(evaluation, file)

    renders = video_length > 0 and renders_frames(env)
    if renders:
        record_video(player, env, video_length, deterministic, repo_folder / VIDEO_NAME)
    else:
        env.close()

    card, metadata = make_model_card(algo, type(model).__name__, repo_id, env_id, evaluation, hyperparams, env_kwargs)
    (repo_folder / "README.md").write_text(card, encoding="utf-8")
    metadata_save(repo_folder / "README.md", metadata)
    return evaluation


def upload(repo_folder: Path, repo_id: str, commit_message: str) -> str:
    """
    Create the Hub repository where needed and upload the folder to it (``huggingface_hub.HfApi``, with the token of
    ``huggingface-cli login`` or ``HF_TOKEN``).

    :return: The repository's URL
    """
    from huggingface_hub import HfApi

    api = HfApi()
    url = api.create_repo(repo_id=repo_id, private=False, exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=str(repo_folder), commit_message=commit_message)
    return str(url)


def push_to_hub(argv: list[str] | None = None) -> str:
    """
    ``python -m sb3_ppg.push_to_hub``: package a run folder (:func:`package_run`) and upload it (:func:`upload`).

    :param argv: Command line arguments (None: ``sys.argv[1:]``)
    :return: The repository's URL
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = push_parser().parse_args(argv)
    import_zoo()
    from huggingface_sb3 import EnvironmentName, ModelName, ModelRepoId
    from rl_zoo3.utils import create_test_env, get_saved_hyperparams

    env_name = EnvironmentName(args.env)
    run_folder, model_path = find_run(
        args.folder, args.algo, env_name, args.exp_id, args.load_best, args.load_checkpoint, args.load_last_checkpoint
    )
    print(f"Loading {model_path}")
    repo_id = ModelRepoId(args.organization, args.repo_name or ModelName(args.algo, env_name))
    with command_line_threads(argv), zoo_registered(), zoo_reads_run_files_safely():
        hyperparams, stats_path = get_saved_hyperparams(os.path.join(run_folder, env_name), test_mode=True)
        # As the zoo's enjoy: the config's env_kwargs, replaced by the run's args.yml ones where it has some
        env_kwargs = dict(hyperparams.pop("env_kwargs", None) or {})
        env_kwargs = read_run_file(os.path.join(run_folder, env_name, "args.yml")).get("env_kwargs") or env_kwargs
        render_kwargs = {"render_mode": "rgb_array"} if not args.no_render and has_rgb_array(env_name.gym_id) else {}
        env = create_test_env(
            env_name.gym_id,
            n_envs=args.n_envs,
            stats_path=stats_path,
            seed=args.seed,
            should_render=False,
            hyperparams=dict(hyperparams),
            env_kwargs={**env_kwargs, **render_kwargs},
        )
        model = PPG_ALGORITHMS[args.algo].load(model_path, env=env, device=args.device)
        # Procgen plays with sampled actions (as enjoy and the paper evaluate), other envs deterministically
        deterministic = args.deterministic or not (args.stochastic or is_procgen_env_id(env_name.gym_id))
        config = read_run_file(os.path.join(run_folder, env_name, "config.yml"))
        repo_folder = Path(args.local_repo_path) / repo_id.split("/")[1]
        package_run(
            model,
            env,
            run_folder,
            args.algo,
            env_name.gym_id,
            repo_folder,
            repo_id,
            config,
            env_kwargs,
            n_eval_episodes=args.n_eval_episodes,
            deterministic=deterministic,
            video_length=0 if args.no_render else args.n_timesteps,
        )
    print(f"Uploading {repo_folder} to https://huggingface.co/{repo_id} (make sure you have the rights)")
    url = upload(repo_folder, repo_id, args.commit_message)
    print(f"Pushed: {url}")
    return url


def load_from_hub(argv: list[str] | None = None) -> None:
    """
    ``python -m sb3_ppg.load_from_hub``: rl-zoo3's ``download_from_hub`` (a repository written by ``push_to_hub``,
    saved as a run of the log folder), with sb3_ppg's algorithms allowed.

    :param argv: Command line arguments (None: ``sys.argv[1:]``)
    """
    args = load_parser().parse_args(argv)
    import_zoo()
    from huggingface_sb3 import EnvironmentName
    from rl_zoo3.load_from_hub import download_from_hub

    download_from_hub(
        algo=args.algo,
        env_name=EnvironmentName(args.env),
        exp_id=args.exp_id,
        folder=args.folder,
        organization=args.organization,
        repo_name=args.repo_name,
        force=args.force,
    )


def main(command: str, argv: list[str] | None = None) -> None:
    """
    Run ``push_to_hub`` or ``load_from_hub``; a missing zoo extra or model ends the command with one line.

    :param command: ``"push_to_hub"`` or ``"load_from_hub"``
    :param argv: Command line arguments (None: ``sys.argv[1:]``)
    """
    try:
        push_to_hub(argv) if command == "push_to_hub" else load_from_hub(argv)
    except (ZooNotInstalledError, NoModelError) as error:
        sys.exit(f"error: {error}")
