"""
PPG's progress bar (``learn(progress_bar=True)``, the command line's ``-P``): SB3's, which stands still through the
auxiliary phases, with the phase's progress and an estimate of the time left that counts them. Callbacks told of the
auxiliary phase's progress: :class:`AuxPhaseCallback`.
"""

import math
import sys
from time import perf_counter
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback

from sb3_ppg.common import distributed


class AuxPhaseCallback(BaseCallback):
    """
    A callback that is told of the auxiliary phase's progress: ``PPG`` calls :meth:`on_aux_phase_start` before the
    phase (before it computes the old policy), :meth:`on_aux_minibatch` after each of its minibatches and
    :meth:`on_aux_phase_end` after it, on every such callback (nested ones included).
    """

    def on_aux_phase_start(self, n_epochs: int, n_minibatches: int) -> None:
        """
        :param n_epochs: The phase's epochs (E_aux)
        :param n_minibatches: Minibatches per epoch
        """

    def on_aux_minibatch(self, epoch: int, minibatch: int) -> None:
        """
        :param epoch: The epoch (from 1)
        :param minibatch: The minibatch of the epoch just trained (from 1)
        """

    def on_aux_phase_end(self) -> None:
        """Called after the phase."""


class AuxPhaseLinesCallback(AuxPhaseCallback):
    """
    A line when an auxiliary phase starts and after each of its epochs (to stdout), for a training run without a
    progress bar: the phase can take as long as many rollouts, with no table printed meanwhile (the command line's
    default, without ``-P``).
    """

    def __init__(self) -> None:
        super().__init__()
        self.phase_start = 0.0
        self.phase_size = (0, 0)  # epochs, minibatches per epoch

    def _on_step(self) -> bool:
        return True

    def on_aux_phase_start(self, n_epochs: int, n_minibatches: int) -> None:
        self.phase_start = perf_counter()
        self.phase_size = (n_epochs, n_minibatches)
        phase = getattr(self.model, "n_aux_phases", 0) + 1
        print(
            f"Auxiliary phase {phase} at step {self.model.num_timesteps:,}: {n_epochs} epochs of {n_minibatches} minibatches",
            flush=True,
        )

    def on_aux_minibatch(self, epoch: int, minibatch: int) -> None:
        n_epochs, n_minibatches = self.phase_size
        if minibatch == n_minibatches:
            print(f"  epoch {epoch}/{n_epochs} ({format_duration(perf_counter() - self.phase_start)})", flush=True)

    def on_aux_phase_end(self) -> None:
        print(f"Auxiliary phase done in {format_duration(perf_counter() - self.phase_start)}", flush=True)


def format_duration(seconds: float) -> str:
    """
    :param seconds: A duration
    :return: ``"m:ss"`` or ``"h:mm:ss"``
    """
    seconds = max(round(seconds), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class PPGProgressBarCallback(AuxPhaseCallback):
    """
    A progress bar over the env steps (tqdm), as SB3's ``ProgressBarCallback`` but from the model's step count to the
    total (a continued run's bar continues), that says what training is doing
    (``rollout``, ``policy phase``, ``aux phase epoch e/E, minibatch m/M``) and keeps moving through the auxiliary
    phases. The time left counts them: the env steps left at the rate of the steps outside the auxiliary phases, plus
    the auxiliary phases still to come at the measured duration of one (the current one's duration is extrapolated
    from its minibatches; before the first one, the line says that they are not counted yet). ``PPG.learn()`` uses it
    for ``progress_bar=True``.

    :param tqdm_kwargs: Extra arguments of ``tqdm`` (e.g. ``file=``; default: ``sys.stdout``, as SB3's bar)
    """

    def __init__(self, **tqdm_kwargs: Any) -> None:
        super().__init__()
        self.tqdm_kwargs = tqdm_kwargs
        self.pbar: Any = None
        self.total_steps = 0
        self.start_steps = 0
        self.start_time = 0.0
        self.aux_phase_time = 0.0
        self.aux_phases_timed = 0
        self.aux_phase_start: float | None = None
        self.aux_progress = (0, 0, 0, 0)  # epoch, minibatch, epochs, minibatches
        self.last_refresh = 0.0

    def steps_per_call(self) -> int:
        """:return: The env steps of one call to ``env.step()`` (all ranks' under torchrun)"""
        return self.training_env.num_envs * distributed.get_world_size()

    def _on_training_start(self) -> None:
        from tqdm import tqdm

        # A continued run (reset_num_timesteps=False, --resume) continues its bar: e.g. 4096/12288, not 0/8192
        self.start_steps = self.model.num_timesteps
        self.total_steps = self.locals["total_timesteps"]
        self.start_time = perf_counter()
        kwargs = dict(
            total=self.total_steps,
            initial=self.start_steps,
            unit=" steps",
            smoothing=0.0,
            dynamic_ncols=True,
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
            # Where SB3's (rich) bar goes
            file=sys.stdout,
        )
        self.pbar = tqdm(**{**kwargs, **self.tqdm_kwargs})

    def _on_rollout_start(self) -> None:
        self.pbar.set_description("rollout", refresh=False)

    def _on_step(self) -> bool:
        self.pbar.update(self.steps_per_call())
        return True

    def _on_rollout_end(self) -> None:
        self.pbar.set_description("policy phase", refresh=False)
        self._set_time_left()
        self.pbar.refresh()

    def on_aux_phase_start(self, n_epochs: int, n_minibatches: int) -> None:
        self.aux_phase_start = perf_counter()
        self.aux_progress = (0, 0, n_epochs, n_minibatches)
        self.pbar.set_description("aux phase: old policy", refresh=False)
        self._set_time_left()
        self.pbar.refresh()

    def on_aux_minibatch(self, epoch: int, minibatch: int) -> None:
        _, _, n_epochs, n_minibatches = self.aux_progress
        self.aux_progress = (epoch, minibatch, n_epochs, n_minibatches)
        self.pbar.set_description(f"aux phase: epoch {epoch}/{n_epochs}, minibatch {minibatch}/{n_minibatches}", refresh=False)
        now = perf_counter()
        # At most 10 refreshes per second (minibatches of small networks take a millisecond)
        if now - self.last_refresh >= 0.1 or (epoch, minibatch) == (n_epochs, n_minibatches):
            self.last_refresh = now
            self._set_time_left()
            self.pbar.refresh()

    def on_aux_phase_end(self) -> None:
        if self.aux_phase_start is not None:
            self.aux_phase_time += perf_counter() - self.aux_phase_start
            self.aux_phases_timed += 1
        self.aux_phase_start = None

    def aux_phases_left(self) -> int:
        """
        :return: The auxiliary phases to come after the current point (not the one running): one every
            ``n_policy_iters`` rollouts, counted from the rollouts in the auxiliary buffer. Called at the end of a
            rollout (whose ``train()`` is still to come) or during an auxiliary phase.
        """
        aux_buffer = getattr(self.model, "aux_buffer", None)
        if aux_buffer is None:
            return 0
        rollout_steps = self.model.n_steps * self.steps_per_call()
        rollouts_left = math.ceil(max(self.total_steps - self.pbar.n, 0) / rollout_steps)
        if self.aux_phase_start is not None:
            return rollouts_left // self.model.n_policy_iters
        return (aux_buffer.n_iterations + 1 + rollouts_left) // self.model.n_policy_iters

    def time_left(self) -> tuple[float, bool]:
        """
        :return: The estimated seconds left, and whether it counts every auxiliary phase left (False before one was
            timed)
        """
        now = perf_counter()
        in_aux = 0.0 if self.aux_phase_start is None else now - self.aux_phase_start
        other_time = now - self.start_time - self.aux_phase_time - in_aux
        steps_done = self.pbar.n - self.start_steps
        steps_left = max(self.total_steps - steps_done, 0)
        seconds = steps_left * other_time / steps_done if steps_done > 0 else math.nan
        phase_time = self.aux_phase_time / self.aux_phases_timed if self.aux_phases_timed else math.nan
        if self.aux_phase_start is not None:
            epoch, minibatch, n_epochs, n_minibatches = self.aux_progress
            done = ((epoch - 1) * n_minibatches + minibatch) / max(n_epochs * n_minibatches, 1) if epoch > 0 else 0.0
            current = in_aux / done if done > 0 else phase_time
            if math.isnan(phase_time):
                phase_time = current
            seconds += current - in_aux if not math.isnan(current) else 0.0
        phases_left = self.aux_phases_left()
        if phases_left == 0:
            return seconds, True
        if math.isnan(phase_time):
            return seconds, False
        return seconds + phases_left * phase_time, True

    def _set_time_left(self) -> None:
        seconds, complete = self.time_left()
        if math.isnan(seconds):
            return
        postfix = f"~{format_duration(seconds)} left"
        if not complete:
            postfix += " + the auxiliary phases (not timed yet)"
        self.pbar.set_postfix_str(postfix, refresh=False)

    def _on_training_end(self) -> None:
        # May be called twice (by learn() and by the RL Zoo after it)
        if self.pbar is None:
            return
        self.pbar.set_description("trained", refresh=False)
        self.pbar.set_postfix_str("", refresh=False)
        self.pbar.refresh()
        self.pbar.close()
        self.pbar = None
