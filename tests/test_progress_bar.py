"""PPG's progress bar (learn(progress_bar=True)): it shows the auxiliary phase's progress and counts its time."""

import io
from types import SimpleNamespace

import pytest
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppg import PPG
from sb3_ppg.common import progress_bar
from sb3_ppg.common.progress_bar import PPGProgressBarCallback, format_duration

pytest.importorskip("tqdm")


def test_learn_shows_the_aux_phase(monkeypatch):
    """learn(progress_bar=True) uses PPG's bar: its description follows every minibatch of the auxiliary phases."""
    seen = []

    class RecordingBar(PPGProgressBarCallback):
        def __init__(self):
            super().__init__(file=io.StringIO())

        def on_aux_minibatch(self, epoch, minibatch):
            super().on_aux_minibatch(epoch, minibatch)
            seen.append((self.pbar.desc, self.pbar.n))

    monkeypatch.setattr("sb3_ppg.ppg.ppg.PPGProgressBarCallback", RecordingBar)
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    model = PPG("MlpPolicy", env, n_steps=8, batch_size=16, n_policy_iters=2, n_aux_epochs=2, aux_batch_rollouts=2, seed=0)
    model.learn(total_timesteps=64, progress_bar=True)
    # 4 rollouts of 16 steps, an auxiliary phase after the 2nd and the 4th, 2 epochs of 2 minibatches each
    expected = [f"aux phase: epoch {e}/2, minibatch {m}/2: " for e in (1, 2) for m in (1, 2)]
    assert seen == [(desc, 32) for desc in expected] + [(desc, 64) for desc in expected]


def test_time_left_counts_the_aux_phases(monkeypatch):
    """2 envs x 10 steps a rollout, 4 rollouts, an auxiliary phase every 2: a fake clock, 10 s per rollout, 20 s per
    auxiliary phase."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(progress_bar, "perf_counter", lambda: clock.now)
    aux_buffer = SimpleNamespace(n_iterations=0)
    bar = PPGProgressBarCallback(file=io.StringIO())
    env = SimpleNamespace(num_envs=2)
    bar.model = SimpleNamespace(aux_buffer=aux_buffer, n_steps=10, n_policy_iters=2, num_timesteps=0, get_env=lambda: env)
    bar.locals = {"total_timesteps": 80}
    bar._on_training_start()

    def rollout(end_time):
        bar._on_rollout_start()
        for _ in range(10):
            bar._on_step()
        clock.now = end_time
        bar._on_rollout_end()

    rollout(10.0)
    # 60 steps left at 0.5 s a step; two auxiliary phases to come, not timed yet
    assert bar.time_left() == (30.0, False)
    assert bar.pbar.postfix == "~0:30 left + the auxiliary phases (not timed yet)"
    aux_buffer.n_iterations = 1
    rollout(20.0)
    bar.on_aux_phase_start(2, 2)
    clock.now = 25.0
    bar.on_aux_minibatch(1, 1)
    assert bar.pbar.desc == "aux phase: epoch 1/2, minibatch 1/2: "
    # 40 steps at 0.5 s; this phase: a quarter done in 5 s, 15 s left; the next one as long as this one (20 s)
    assert bar.time_left() == (20.0 + 15.0 + 20.0, True)
    clock.now = 40.0
    bar.on_aux_minibatch(2, 2)
    bar.on_aux_phase_end()
    aux_buffer.n_iterations = 0
    rollout(50.0)
    # 20 steps at 0.5 s (30 s of 60 steps outside the auxiliary phase), one auxiliary phase of 20 s
    assert bar.time_left() == (10.0 + 20.0, True)
    assert bar.pbar.postfix == "~0:30 left"
    bar._on_training_end()
    assert bar.pbar is None


def test_continued_run_continues_the_bar():
    """learn(..., reset_num_timesteps=False) of a run at step 64 restarted its bar at 0/32 (issue 51): 64/96 to 96/96."""
    model = PPG("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2, seed=0), n_steps=8, batch_size=16, n_policy_iters=2,
                n_aux_epochs=1, aux_batch_rollouts=2, seed=0)  # fmt: skip
    model.learn(64)
    output = io.StringIO()
    bar = PPGProgressBarCallback(file=output)
    model.learn(32, callback=bar, reset_num_timesteps=False)
    lines = output.getvalue().replace("\r", "\n")
    assert "64/96" in lines and "96/96" in lines and "/32" not in lines


def test_format_duration():
    assert [format_duration(s) for s in (0, 59.6, 61, 3600 + 62)] == ["0:00", "1:00", "1:01", "1:01:02"]


def test_quickstart_bar_shows_the_aux_phase(monkeypatch):
    """The quick start's bar (python -m sb3_ppg.train) says which epoch and minibatch of the auxiliary phase runs."""
    pytest.importorskip("rl_zoo3")
    from sb3_ppg.cli.quickstart import QuickstartProgressBar

    seen = []

    class RecordingBar(QuickstartProgressBar):
        def on_aux_minibatch(self, epoch, minibatch):
            super().on_aux_minibatch(epoch, minibatch)
            seen.append(self.progress_bar.desc)

    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    model = PPG("MlpPolicy", env, n_steps=8, batch_size=16, n_policy_iters=2, n_aux_epochs=2, aux_batch_rollouts=2, seed=0)
    model.learn(total_timesteps=32, callback=RecordingBar())
    assert seen == [f"auxiliary phase: epoch {e}/2, minibatch {m}/2: " for e in (1, 2) for m in (1, 2)]
