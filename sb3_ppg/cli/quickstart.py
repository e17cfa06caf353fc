"""
The quick start of ``python -m sb3_ppg.train`` (no arguments, or ``--quickstart``): a few minutes of PPG on Procgen
StarPilot (easy) on the CPU, then an evaluation against random actions and a learning-curve PNG, all under
``quickstart_output/``.
"""

import os
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed
from gymnasium import spaces
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecMonitor

from sb3_ppg.cli.arguments import hyperparams_file, latest_run_folder, sb3_ppg_parser
from sb3_ppg.cli.zoo import run_zoo
from sb3_ppg.common.progress_bar import AuxPhaseCallback
from sb3_ppg.ppg import PPG
from sb3_ppg.procgen import ProcgenVecEnv

# Quick start: a CPU-sized run on Procgen StarPilot, easy mode, with the packaged easy preset shrunk to 8 envs,
# 256-step rollouts and short auxiliary phases (N_pi 4, E_aux 2: two auxiliary phases), with small minibatches to keep
# the memory of the CPU backward passes low (~1.5 GB). n_timesteps is given as a hyperparameter (not with -n) so that
# the zoo's hyperparameter printout shows the number of steps that is trained.
QUICKSTART_ENV = "procgen/starpilot-v0"
QUICKSTART_TIMESTEPS = 16_384
QUICKSTART_PARAMS = (
    "n_envs:8",
    "n_steps:256",
    "batch_size:256",
    "n_policy_iters:4",
    "n_aux_epochs:2",
    "aux_batch_rollouts:2",
)
# Every evaluation of the quick start (during training, of the saved model, of random actions) plays this many
# episodes on this many envs, levels from the full distribution, sampled actions, raw game scores
QUICKSTART_EVAL_EPISODES = 32
QUICKSTART_EVAL_ENVS = 8
# Seed of the evaluation env of the saved model and of random actions (the same levels for both)
QUICKSTART_EVAL_SEED = 12345
# The zoo gives its evaluation env only the env kwargs of the command line, not those of the hyperparameter file: without
# these, the evaluations during training would play StarPilot's hard mode (random actions score 0.87 there, 1.47 in
# easy mode: means of 1,280 episodes each)
QUICKSTART_EVAL_ENV_KWARGS = ("distribution_mode:'easy'", "num_levels:0", "start_level:0")
QUICKSTART_OUTPUT = "quickstart_output"
# Measured: python -m sb3_ppg.train from start to end (see docs/guide/quickstart.rst)
QUICKSTART_DURATION = "about 3 minutes on a 2-core CPU, longer on a busy machine"


class QuickstartProgressBar(AuxPhaseCallback):
    """
    The quick start's progress display, given to the zoo as its ``callback`` hyperparameter: a progress bar over the
    env steps, labelled with what training is doing (collecting a rollout, the policy phase, the policy and auxiliary
    phases) and the mean return of the last 100 training episodes, with the remaining time estimated from the average
    rate since the start (tqdm's default, a rate over the last updates, jumps to hours after every pause of the env
    steps: a policy phase, an auxiliary phase, an evaluation). Through the auxiliary phases it shows their epoch and
    minibatch (:class:`~sb3_ppg.common.progress_bar.AuxPhaseCallback`). While it is shown, lines printed to
    ``sys.stdout`` (the zoo's evaluation results) go above it instead of being appended to it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.progress_bar: Any = None
        self.stdout: Any = None
        self.aux_phase_size = (0, 0)

    def _on_training_start(self) -> None:
        from tqdm import tqdm
        from tqdm.contrib import DummyTqdmFile

        total = self.locals["total_timesteps"] - self.model.num_timesteps
        self.stdout = sys.stdout
        self.progress_bar = tqdm(total=total, file=self.stdout, unit=" steps", smoothing=0.0, dynamic_ncols=True)
        sys.stdout = DummyTqdmFile(self.stdout)

    def _on_rollout_start(self) -> None:
        self.progress_bar.set_description("rollout", refresh=self.progress_bar.n > 0)

    def _on_step(self) -> bool:
        self.progress_bar.update(self.training_env.num_envs)
        return True

    def _on_rollout_end(self) -> None:
        aux_buffer = getattr(self.model, "aux_buffer", None)
        aux_phase_next = aux_buffer is not None and aux_buffer.n_iterations + 1 >= self.model.n_policy_iters
        returns = [info["r"] for info in self.model.ep_info_buffer]
        if returns:
            self.progress_bar.set_postfix_str(f"training episodes: mean return {np.mean(returns):.2f}", refresh=False)
        self.progress_bar.set_description("policy + auxiliary phase" if aux_phase_next else "policy phase", refresh=True)

    def on_aux_phase_start(self, n_epochs: int, n_minibatches: int) -> None:
        self.aux_phase_size = (n_epochs, n_minibatches)
        self.progress_bar.set_description("auxiliary phase: old policy", refresh=True)

    def on_aux_minibatch(self, epoch: int, minibatch: int) -> None:
        n_epochs, n_minibatches = self.aux_phase_size
        self.progress_bar.set_description(
            f"auxiliary phase: epoch {epoch}/{n_epochs}, minibatch {minibatch}/{n_minibatches}", refresh=True
        )

    def _on_training_end(self) -> None:
        # Called twice at the end of a run (by SB3's learn() and by the zoo's)
        if self.progress_bar is None:
            return
        sys.stdout = self.stdout
        self.progress_bar.set_description("trained", refresh=False)
        self.progress_bar.close()
        self.progress_bar = None


class UniformRandomPolicy:
    """
    Uniformly random actions, with the ``predict`` of an SB3 model (for ``evaluate_policy``): the baseline the quick
    start compares the trained model with.

    :param action_space: The env's action space
    :param seed: Seed of the action draws
    """

    def __init__(self, action_space: spaces.Space, seed: int) -> None:
        self.action_space = action_space
        self.action_space.seed(seed)

    def predict(
        self, observation: Any, state: Any = None, episode_start: Any = None, deterministic: bool = False
    ) -> tuple[np.ndarray, None]:
        """
        :param observation: A batch of observations (one per env)
        :param state: Unused (no recurrent state)
        :param episode_start: Unused
        :param deterministic: Unused (the actions are always random)
        :return: One random action per env, and no state
        """
        n_envs = len(observation)
        return np.array([self.action_space.sample() for _ in range(n_envs)]), None


def evaluate_with_progress(policy: Any, env: Any, n_episodes: int, label: str) -> np.ndarray:
    """
    ``evaluate_policy`` with sampled actions and a progress bar counting the finished episodes.

    :param policy: A model or anything with its ``predict``
    :param env: The evaluation env (a ``VecEnv``)
    :param n_episodes: Number of episodes
    :param label: The progress bar's label
    :return: The return of each episode
    """
    from tqdm import tqdm

    with tqdm(total=n_episodes, desc=label, unit=" episodes", file=sys.stdout, dynamic_ncols=True) as progress_bar:

        def count_episodes(local_variables: dict[str, Any], _: dict[str, Any]) -> None:
            finished = int(np.sum(local_variables["episode_counts"]))
            if finished > progress_bar.n:
                progress_bar.update(finished - progress_bar.n)

        episode_returns, _ = evaluate_policy(
            policy, env, n_eval_episodes=n_episodes, deterministic=False, return_episode_rewards=True, callback=count_episodes
        )
        # evaluate_policy counts an env's last episode after its last callback
        progress_bar.update(n_episodes - progress_bar.n)
    return np.asarray(episode_returns, dtype=np.float64)


def evaluate_against_random_actions(model: PPG, game: str) -> dict[str, np.ndarray]:
    """
    The quick start's final evaluation: the model and uniformly random actions, each on ``QUICKSTART_EVAL_EPISODES``
    episodes of ``QUICKSTART_EVAL_ENVS`` envs seeded alike (the same levels), from the full level distribution
    (``num_levels=0``, as in training), easy mode, sampled actions, raw game scores, with progress bars.

    It runs with one torch thread: the forward passes of 8 frames gain nothing from two, and on a busy 2-core CPU two
    threads made it 30 to 50 times slower (121-182 s instead of 3.8 s for 32 episodes, the same returns; measured under
    a load average of 3 to 4 from other jobs).

    :param model: The trained model
    :param game: The Procgen game
    :return: The episode returns of the model (``"model"``) and of random actions (``"random"``)
    """
    returns = {}
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, policy in (("model", model), ("random", None)):
            eval_env = VecMonitor(
                ProcgenVecEnv(
                    QUICKSTART_EVAL_ENVS,
                    game,
                    distribution_mode="easy",
                    num_levels=0,
                    start_level=0,
                    rand_seed=QUICKSTART_EVAL_SEED,
                )
            )
            if policy is None:
                policy = UniformRandomPolicy(eval_env.action_space, seed=QUICKSTART_EVAL_SEED)
            label = "Evaluating the trained model" if name == "model" else "Evaluating random actions"
            returns[name] = evaluate_with_progress(policy, eval_env, QUICKSTART_EVAL_EPISODES, label)
            eval_env.close()
    finally:
        torch.set_num_threads(torch_threads)
    return returns


def split_quickstart_params(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """
    Take the zoo's ``-params`` / ``--hyperparams`` values out of the quick start's extra options, so that they can be
    merged with the quick start's (the zoo keeps only the last ``-params``, which would drop the quick start's).

    :param argv: Extra zoo ``train`` options given to the quick start
    :return: (the ``key:value`` hyperparameters by key, the other options in order)
    """
    params: dict[str, str] = {}
    rest = []
    index = 0
    while index < len(argv):
        if argv[index] in ("-params", "--hyperparams"):
            index += 1
            while index < len(argv) and not argv[index].startswith("-"):
                params[argv[index].split(":", 1)[0]] = argv[index]
                index += 1
        else:
            rest.append(argv[index])
            index += 1
    return params, rest


def evaluation_line(label: str, episode_returns: np.ndarray) -> str:
    """
    One line of the quick start's evaluation summary.

    :param label: What was evaluated
    :param episode_returns: The return of each episode
    :return: ``"  <label>: <mean> +/- <standard error of the mean>  (<n> episodes)"``
    """
    n_episodes = len(episode_returns)
    return (
        f"  {label + ':':36}{np.mean(episode_returns):5.2f} +/- {standard_error_of_mean(episode_returns):.2f}  "
        f"({n_episodes} episodes)"
    )


def standard_error_of_mean(episode_returns: np.ndarray) -> float:
    """
    :param episode_returns: The return of each episode
    :return: The standard error of their mean (NaN for one episode)
    """
    n_episodes = len(episode_returns)
    return float(np.std(episode_returns, ddof=1) / np.sqrt(n_episodes)) if n_episodes > 1 else float("nan")


def quickstart(argv: list[str]) -> dict[str, str | float]:
    """
    The quick start: train PPG on Procgen StarPilot (easy) for a CPU-sized budget with a progress bar, save the model,
    evaluate it and random actions the same way, and write its learning curve.

    Every evaluation (during training every half of the run, of the saved model, of random actions) plays
    ``QUICKSTART_EVAL_EPISODES`` episodes on ``QUICKSTART_EVAL_ENVS`` envs with levels from the full distribution
    (as in training), sampled actions (as in the paper) and the game's own score (no reward normalization).

    :param argv: Extra zoo ``train`` options (override the quick start's; ``-params`` values are merged with its own)
    :return: Paths of what was written (``run_folder``, ``model``, ``best_model``, ``evaluations``, ``monitor``,
        ``learning_curve``), the evaluation of the saved model (``mean_reward``, ``std_reward``) and of random
        actions (``random_mean_reward``, ``random_std_reward``)
    """
    # Only the quick start plots: the other commands do not import plot.py (and pandas)
    from sb3_ppg.cli.curves import read_monitor_file
    from sb3_ppg.cli.plot import plot_learning_curves

    known, _ = sb3_ppg_parser().parse_known_args(argv)
    env_id = known.env or QUICKSTART_ENV
    log_folder = os.path.expanduser(known.log_folder or os.path.join(QUICKSTART_OUTPUT, "logs"))
    output_folder = os.path.dirname(os.path.abspath(log_folder))
    n_timesteps = known.n_timesteps or QUICKSTART_TIMESTEPS
    params = {param.split(":", 1)[0]: param for param in QUICKSTART_PARAMS}
    params["n_timesteps"] = f"n_timesteps:{n_timesteps}"
    # The zoo imports the callback by its path
    params["callback"] = f"callback:'{__name__}.{QuickstartProgressBar.__name__}'"
    extra_params, extra_argv = split_quickstart_params([arg for arg in argv if arg != "--quickstart"])
    params.update(extra_params)
    zoo_argv = [
        "--algo",
        "ppg",
        "--env",
        env_id,
        "-conf",
        hyperparams_file("easy"),
        "-params",
        *params.values(),
        "--eval-freq",
        str(n_timesteps // 2),
        "--eval-episodes",
        str(QUICKSTART_EVAL_EPISODES),
        "--n-eval-envs",
        str(QUICKSTART_EVAL_ENVS),
        "--eval-env-kwargs",
        *QUICKSTART_EVAL_ENV_KWARGS,
        "-f",
        log_folder,
        "--seed",
        "0",
        "--device",
        "cpu",
        # The progress bar and one line per evaluation instead of the zoo's and SB3's detailed output
        "--verbose",
        "0",
        *extra_argv,
    ]
    print(f"Quick start: PPG on Procgen StarPilot (easy mode) on the CPU, {QUICKSTART_DURATION}:")
    print(
        f"{n_timesteps:,} training steps, an evaluation of the trained model and of random actions, a learning curve; "
        f"everything goes under {output_folder}."
    )
    start_time = time.time()
    stdout = sys.stdout
    try:
        run_zoo("train", zoo_argv)
    finally:
        # The progress bar redirects sys.stdout while it is shown
        sys.stdout = stdout
    train_time = time.time() - start_time

    run_folder = latest_run_folder(log_folder, env_id)
    env_name = os.path.basename(run_folder).rsplit("_", 1)[0]
    model_path = os.path.join(run_folder, f"{env_name}.zip")
    model = PPG.load(model_path, device="cpu")

    game = env_id.split("/")[-1].rsplit("-v", 1)[0]
    returns = evaluate_against_random_actions(model, game)

    curve_path = os.path.join(output_folder, "learning_curve.png")
    title = f"PPG on {env_id} (easy), quick start"
    # Beside the training episodes: the evaluations the summary prints (mean +/- standard error) and random actions
    with np.load(os.path.join(run_folder, "evaluations.npz")) as evaluations:
        steps = np.append(evaluations["timesteps"], model.num_timesteps)
        evaluated = [*evaluations["results"], returns["model"]]
    means = np.array([np.mean(episode_returns) for episode_returns in evaluated])
    errors = np.array([standard_error_of_mean(episode_returns) for episode_returns in evaluated])
    extras: dict[str, Any] = {
        "reference_lines": {f"random actions ({len(returns['random'])} episodes)": float(np.mean(returns["random"]))},
        "points": {f"evaluations ({QUICKSTART_EVAL_EPISODES} episodes, +/- standard error)": (steps, means, errors)},
    }
    try:
        plot_learning_curves([run_folder], output=curve_path, smoothing=20, title=title, **extras)
    except ValueError:
        # No training episode finished (very short run): plot the evaluations instead
        plot_learning_curves([run_folder], output=curve_path, curve_type="eval", title=title, **extras)

    results: dict[str, str | float] = {
        "run_folder": os.path.abspath(run_folder),
        "model": os.path.abspath(model_path),
        "best_model": os.path.abspath(os.path.join(run_folder, "best_model.zip")),
        "evaluations": os.path.abspath(os.path.join(run_folder, "evaluations.npz")),
        "monitor": os.path.abspath(os.path.join(run_folder, "0.monitor.csv")),
        "learning_curve": os.path.abspath(curve_path),
        "mean_reward": float(np.mean(returns["model"])),
        "std_reward": float(np.std(returns["model"])),
        "random_mean_reward": float(np.mean(returns["random"])),
        "random_std_reward": float(np.std(returns["random"])),
    }
    print()
    print(f"Quick start: trained in {train_time / 60:.1f} min.")
    print(
        "Mean return per episode (sampled actions, levels from the full distribution as in training, the game's own "
        "score; +/- the standard error of the mean, where the zoo's lines above show the standard deviation):"
    )
    with np.load(results["evaluations"]) as evaluations:
        for step, episode_returns in zip(evaluations["timesteps"], evaluations["results"], strict=True):
            print(evaluation_line(f"during training, at step {step:,}", episode_returns))
    print(evaluation_line("trained model, saved and loaded", returns["model"]))
    print(evaluation_line("random actions, the same levels", returns["random"]))
    monitor = read_monitor_file(results["monitor"])
    if len(monitor) > 0:
        last = monitor["r"].to_numpy()[-100:]
        print(f"  {f'training episodes, the last {len(last)}:':36}{np.mean(last):5.2f}  (played while the policy learned)")
    print(learning_verdict(returns["model"], returns["random"], n_timesteps))
    print(f"  run folder:       {results['run_folder']}")
    print(f"  trained model:    {results['model']}")
    print(f"  best model:       {results['best_model']}  (best evaluation during training)")
    print(f"  evaluations:      {results['evaluations']}")
    print(f"  episode log:      {results['monitor']}")
    print(f"  learning curve:   {results['learning_curve']}")
    print(f"Play the trained model: python -m sb3_ppg.enjoy --env {env_id} -f {log_folder} --no-render -n 2000")
    return results


def learning_verdict(model_returns: np.ndarray, random_returns: np.ndarray, n_timesteps: int) -> str:
    """
    Whether the trained model did better than random actions, by more than the noise of the two evaluations
    (twice the standard error of the difference of their means).

    :param model_returns: The trained model's episode returns
    :param random_returns: Random actions' episode returns
    :param n_timesteps: The number of training steps
    :return: A sentence saying so
    """
    difference = float(np.mean(model_returns) - np.mean(random_returns))
    variances = [
        np.var(returns, ddof=1) / len(returns) if len(returns) > 1 else np.nan for returns in (model_returns, random_returns)
    ]
    standard_error = float(np.sqrt(sum(variances)))
    if difference > 2 * standard_error:
        return (
            f"The trained model beats random actions by {difference:.2f} ({difference / standard_error:.1f} standard errors)."
        )
    return (
        f"The trained model is not clearly better than random actions yet ({difference:+.2f} +/- {standard_error:.2f}): "
        f"{n_timesteps:,} steps are only the start of training (StarPilot's mean return is ~3 after 131k steps: "
        "docs/procgen_learning.md)."
    )
