"""``PPGBase``: what PPG needs around its training loop: optimizer steps, save/load, set_env, the aux buffer on disk."""

import io
import os
import pathlib
import warnings
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch as th
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback
from stable_baselines3.common.utils import check_for_correct_spaces, explained_variance
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppg import data_parallel, distributed, losses, resume
from sb3_ppg.buffers import AuxiliaryBuffer, Minibatch, split_minibatch
from sb3_ppg.checkpoints import iter_callbacks
from sb3_ppg.policies import PPGPolicy
from sb3_ppg.validation import check_aux_buffer_memory, gradient_norm, resolve_batch_size, schedule_value

SelfPPGBase = TypeVar("SelfPPGBase", bound="PPGBase")


class PPGBase(OnPolicyAlgorithm):
    """
    The parts of :class:`~sb3_ppg.PPG` around its training loop: one optimizer step (finite check, gradient
    clipping), SB3's ``BaseAlgorithm`` contract (the auxiliary buffer and the extra optimizers in ``save()`` /
    ``load()``, ``set_env()`` with another number of envs) and the auxiliary buffer on disk. ``PPG`` sets every
    attribute used here in its constructor; use ``PPG``, not this class.
    """

    policy: PPGPolicy
    n_policy_iters: int
    n_aux_epochs: int
    aux_buffer: AuxiliaryBuffer | None
    aux_optimizer: th.optim.Optimizer | None
    value_optimizer: th.optim.Optimizer | None
    _auto_batch_size: bool
    _phase_dtypes: dict[str, th.dtype]
    _micro_batch_size: int | None
    _n_aux_phases: int
    _compute_old_distributions: Callable[[], None]
    _train_aux_phase: Callable[[], None]
    max_grad_norm: float | None  # type: ignore[assignment]
    #: Whether the model is at a rollout boundary: ``train()`` has consumed the last rollout collected (or none was
    #: collected yet). False from the start of a rollout until its ``train()`` returns, so also after an exception
    #: (Ctrl-C) inside either: ``PPGCheckpointCallback`` writes a checkpoint only at a boundary.
    _at_rollout_boundary: bool = True

    def _check_aux_buffer_memory(self, n_envs: int) -> None:
        """Check that the auxiliary buffer for ``n_envs`` envs fits in memory, before allocating it."""
        if self.n_aux_epochs > 0:
            args = dict(n_policy_iters=self.n_policy_iters, n_steps=self.n_steps, n_envs=n_envs)
            spaces = dict(observation_space=self.observation_space, action_space=self.action_space)
            check_aux_buffer_memory(AuxiliaryBuffer.estimate_nbytes(**args, **spaces), **args)

    def _make_aux_buffer(self, check_memory: bool = True) -> AuxiliaryBuffer | None:
        """The auxiliary buffer for the current ``n_envs`` (None when the auxiliary phase is off); see above."""
        if check_memory:
            self._check_aux_buffer_memory(self.n_envs)
        if self.n_aux_epochs == 0:
            return None
        return AuxiliaryBuffer(
            self.n_policy_iters, self.n_steps, self.n_envs, self.observation_space, self.action_space, device=self.device
        )

    def _make_optimizer(self) -> th.optim.Optimizer:
        """A new optimizer over all policy parameters, of the policy optimizer's class and settings."""
        return self.policy.optimizer_class(self.policy.parameters(), lr=self.lr_schedule(1), **self.policy.optimizer_kwargs)  # type: ignore[call-arg]

    def learn(
        self: SelfPPGBase,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "PPG",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfPPGBase:
        """SB3's ``learn()``, with PPG's TensorBoard run name (``PPG_1``, ...)."""
        return super().learn(
            total_timesteps=total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=tb_log_name,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )

    # ------------------------------------------------------------------------------------------------------------
    # Data-parallel training (torchrun): hooks into sb3_ppg.distributed, which do nothing in a single process
    # ------------------------------------------------------------------------------------------------------------

    def _setup_learn(
        self,
        total_timesteps: int,
        callback: MaybeCallback = None,
        reset_num_timesteps: bool = True,
        tb_log_name: str = "run",
        progress_bar: bool = False,
    ) -> tuple[int, BaseCallback]:
        if distributed.is_active():
            data_parallel.prepare_learn(self, total_timesteps, reset_num_timesteps, callback)
        return super()._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar)

    def _init_callback(self, callback: MaybeCallback, progress_bar: bool = False) -> BaseCallback:
        if distributed.is_active():
            return super()._init_callback(data_parallel.wrap_callback(callback, progress_bar))
        return super()._init_callback(callback, progress_bar)

    def set_random_seed(self, seed: int | None = None) -> None:
        """Seed the generators; in data-parallel training rank ``r`` uses ``seed + r * n_envs`` (distinct env seeds)."""
        if seed is not None and distributed.is_active():
            seed += distributed.get_rank() * self.n_envs
        super().set_random_seed(seed)

    def save(
        self,
        path: str | pathlib.Path | io.BufferedIOBase,
        exclude: Iterable[str] | None = None,
        include: Iterable[str] | None = None,
    ) -> None:
        """SB3's ``save``; in data-parallel training only rank 0 writes (every rank holds the same model)."""
        if distributed.get_rank() == 0:
            super().save(path, exclude=exclude, include=include)

    def _average_gradients(self) -> None:
        """Average the gradients over the ranks before a step (data-parallel training only)."""
        if distributed.is_active():
            distributed.average_gradients(self.policy.parameters())

    def collect_rollouts(
        self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int
    ) -> bool:
        """
        SB3's ``collect_rollouts()``, after telling the callbacks that want to know (``PPGCheckpointCallback``) that
        this is a rollout boundary: ``train()`` has consumed the previous rollout and nothing of the next one has
        been drawn yet. In data-parallel training, the ranks then share its outcome (steps, statistics).
        """
        for child in iter_callbacks(callback):
            if hasattr(child, "on_rollout_boundary"):
                child.on_rollout_boundary()
        self._at_rollout_boundary = False  # until train() has consumed this rollout
        if distributed.is_active():
            return data_parallel.collect_rollouts(
                self, lambda: super(PPGBase, self).collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
            )
        return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)

    def _finish_interrupted_aux_phase(self) -> None:
        """Run an auxiliary phase that an exception (or Ctrl-C) interrupted, from its start, if there is one."""
        if self.aux_buffer is not None and self.aux_buffer.full():
            warnings.warn(
                "The last auxiliary phase was interrupted: it runs again from its start on the stored rollouts "
                "(the updates it had made are kept) before this iteration's rollout is stored."
            )
            self._run_aux_phase()

    def _run_aux_phase(self) -> None:
        """
        Compute the old policy on the full auxiliary buffer, run the auxiliary phase and empty the buffer. When the
        phase is interrupted (an exception, Ctrl-C) the buffer stays full, so that the model stays usable: the
        next ``train()`` runs the phase again, and the error says how to resume.
        """
        self.policy.compute_dtype = self._phase_dtypes["aux"]
        try:
            self._compute_old_distributions()
            self._train_aux_phase()
        except BaseException as error:
            if hasattr(error, "add_note"):
                error.add_note(
                    f"PPG: interrupted during the auxiliary phase at timestep {self.num_timesteps} (auxiliary phase "
                    f"{self._n_aux_phases + 1}). The model stays usable: learn() again reruns that phase from its start. "
                    "To resume exactly instead, load the last checkpoint written by PPGCheckpointCallback with "
                    "PPG.load_checkpoint(); it is left intact."
                )
            raise
        finally:
            self.policy.compute_dtype = self._phase_dtypes["rollout"]
        self.aux_buffer.reset()  # type: ignore[union-attr]

    def _log_policy_phase(
        self,
        stats: dict[str, list[th.Tensor]],
        loss: th.Tensor,
        clip_range: float | None,
        clip_range_vf: float | None,
        continue_training: bool,
    ) -> None:
        """Record the policy phase's diagnostics (means over its minibatches; approx_kl over the last epoch)."""
        for name in ("entropy_loss", "policy_gradient_loss", "value_loss", "approx_kl", "clip_fraction", "kl_penalty"):
            if stats.get(name):
                self.logger.record(f"train/{name}", th.stack(stats[name]).mean().item())
        explained_var = explained_variance(self.rollout_buffer.values.flatten(), self.rollout_buffer.returns.flatten())
        self.logger.record("train/loss", loss.item())
        self.logger.record("train/explained_variance", explained_var)
        if hasattr(self.policy, "log_std"):
            self.logger.record("train/std", th.exp(self.policy.log_std).mean().item())
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        if clip_range is not None:
            self.logger.record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", clip_range_vf)
        if not continue_training and self.verbose >= 1:
            print(f"Early stopping of the policy phase: approx_kl reached 1.5 * target_kl = {1.5 * self.target_kl:.4f}")

    def _schedule_value(self, name: str, progress_remaining: float) -> float | None:
        """
        The value at ``progress_remaining`` of the schedule ``name`` (``"learning_rate"``, ``"aux_learning_rate"``,
        the learning rate's when None, ``"clip_range"``, ``"clip_range_vf"``), checked; None for a clip range of None.
        """
        schedule = self.lr_schedule if name == "learning_rate" else getattr(self, name)
        if name == "aux_learning_rate" and schedule is None:
            name, schedule = "learning_rate", self.lr_schedule
        return None if schedule is None else schedule_value(schedule, name, progress_remaining)

    def _update_learning_rate(self, optimizers: list[th.optim.Optimizer] | th.optim.Optimizer) -> None:
        """SB3's learning-rate update, after checking the schedule's value (a ``ValueError`` names a bad one)."""
        self._schedule_value("learning_rate", self._current_progress_remaining)
        super()._update_learning_rate(optimizers)

    def _backward(
        self,
        minibatch: Minibatch,
        compute_loss: Callable[[Minibatch], tuple[th.Tensor, losses.Diagnostics]],
        phase: str,
        divisor: int = 1,
    ) -> tuple[th.Tensor, losses.Diagnostics]:
        """
        Compute a minibatch's loss, check it and backpropagate ``loss / divisor`` (adding to the gradients). With
        ``micro_batch_size``, a larger minibatch runs as micro-batches, one forward and backward pass each, with their
        losses weighted by their share of the samples: the same gradient up to float rounding, with the activations
        of one micro-batch at a time.

        :param minibatch: the minibatch
        :param compute_loss: its loss (a mean over the samples) and diagnostics (means as well)
        :param phase: "policy" or "auxiliary", for the error message of a non-finite loss
        :param divisor: what the loss is divided by (the minibatches of an accumulated gradient)
        :return: the minibatch's loss (detached) and diagnostics
        """
        results = []
        for micro_batch, share in split_minibatch(minibatch, self._micro_batch_size):
            loss, diagnostics = compute_loss(micro_batch)
            self._check_finite(loss, phase)
            (loss * share / divisor).backward()
            results.append((share, loss.detach(), diagnostics))
        if len(results) == 1:
            return results[0][1], results[0][2]
        total_loss = sum(share * loss for share, loss, _ in results)
        names = results[0][2].keys()
        return total_loss, {name: sum(share * diagnostics[name] for share, _, diagnostics in results) for name in names}  # type: ignore[misc]

    def _step(self, optimizer: th.optim.Optimizer, phase: str) -> None:
        """Average the gradients over the ranks, check and clip them, step the optimizer and clear them."""
        self._average_gradients()
        self._clip_gradients(phase)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def _clip_gradients(self, phase: str) -> None:
        """
        Clip the global gradient norm to ``max_grad_norm`` (when set), after checking that the gradients are
        finite: a finite loss can still have inf or NaN gradients, which must not reach the weights.

        :param phase: "policy" or "auxiliary", for the message
        :raises FloatingPointError: when the gradients' global norm is not finite (the gradients are cleared)
        """
        if self.max_grad_norm is not None:
            total_norm = th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
        else:
            total_norm = gradient_norm(self.policy.parameters())
        if not th.isfinite(total_norm).item():
            self.policy.zero_grad(set_to_none=True)
            raise FloatingPointError(
                f"PPG's {phase}-phase gradients have a non-finite norm ({total_norm.item()}) at timestep "
                f"{self.num_timesteps} although the loss is finite: training stopped before the weights were updated "
                "with them. Common causes: a learning rate that is too high (lower learning_rate / "
                "aux_learning_rate), observations or rewards on a huge scale (use VecNormalize), or a custom network "
                "or features extractor whose gradient is not finite somewhere (e.g. sqrt or log at 0)."
            )

    def _check_finite(self, loss: th.Tensor, phase: str) -> None:
        """
        Stop training with a clear error when a loss is NaN or infinite (before it corrupts the weights).

        :param loss: the loss about to be backpropagated
        :param phase: "policy" or "auxiliary", for the message
        """
        if not th.isfinite(loss).item():
            raise FloatingPointError(
                f"PPG's {phase}-phase loss is {loss.item()} at timestep {self.num_timesteps}: training stopped before "
                "the weights were updated with it. Common causes: NaN/inf rewards or observations from the "
                "environment (check them, e.g. with VecCheckNan), rewards on a huge scale (use VecNormalize), or a "
                "learning rate that is too high (lower learning_rate / aux_learning_rate or set max_grad_norm)."
            )

    @classmethod
    def load(  # type: ignore[override]
        cls: type[SelfPPGBase],
        path: str | pathlib.Path | io.BufferedIOBase,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> SelfPPGBase:
        """
        Load the model from a zip file (see SB3's ``BaseAlgorithm.load``). A truncated or corrupt file raises a
        ``ValueError`` that says so.
        """
        try:
            return super().load(
                path,
                env=env,
                device=device,
                custom_objects=custom_objects,
                print_system_info=print_system_info,
                force_reset=force_reset,
                **kwargs,
            )
        except AssertionError as error:
            # SB3 asserts when a truncated zip still opens (the nested policy.pth zip's directory is found)
            if "No data found" in str(error):
                raise ValueError(f"{path!r} is not a complete PPG model zip (truncated or corrupt file).") from error
            raise

    @classmethod
    def load_checkpoint(
        cls: type[SelfPPGBase],
        path: str | os.PathLike,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        **kwargs: Any,
    ) -> SelfPPGBase:
        """
        Load a checkpoint written by :class:`~sb3_ppg.PPGCheckpointCallback`, ready to continue the run:
        ``model.learn(total_timesteps - model.num_timesteps, reset_num_timesteps=False)`` (SB3 counts the steps of
        ``learn()`` from the current ``num_timesteps``) ends, on CPU with a seed, with the same parameters, bit for
        bit, as the run that was never interrupted. Every file is checked against the manifest's checksums first.
        Under torchrun every rank calls it and restores its own part (envs, random generators, auxiliary buffer),
        with the checkpoint's world size. Checkpoints hold pickles (the model zip, DummyVecEnv envs): load trusted ones.

        :param path: a checkpoint folder, or the callback's ``save_path``: then the newest checkpoint (the one written
            last) that verifies is used, and a warning names the damaged newer ones it skipped
        :param env: the env to continue with, built as in the run (same wrappers, same number of envs); the states
            of its envs are restored (the envs of a ``DummyVecEnv`` are replaced by their saved copies). Where they
            could not be saved, the episodes restart, with a warning. ``None``: the model comes without env.
        :param device: the device of the model
        :param kwargs: passed to :meth:`load` (e.g. ``custom_objects``)
        :return: the model
        :raises FileNotFoundError: when ``path`` holds no complete checkpoint
        :raises ValueError: when the checkpoint ``path`` is damaged (naming the newest older one that verifies), every
            checkpoint of the folder ``path`` is damaged, or the checkpoint does not fit ``env`` or the world size
        """
        return resume.load_checkpoint(cls, path, env=env, device=device, **kwargs)  # type: ignore[return-value]

    def _maybe_recommend_cpu(self, mlp_class_name: str = "PPGPolicy") -> None:
        super()._maybe_recommend_cpu(mlp_class_name)

    def _excluded_save_params(self) -> list[str]:
        excluded = ["aux_buffer", "aux_optimizer", "value_optimizer", "_distributed_stats_base", "_at_rollout_boundary"]
        return [*super()._excluded_save_params(), *excluded]

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts = ["policy", "policy.optimizer"]
        if self.aux_optimizer is not None:
            state_dicts.append("aux_optimizer")
        if self.value_optimizer is not None:
            state_dicts.append("value_optimizer")
        return state_dicts, []

    def set_env(self, env: GymEnv, force_reset: bool = True) -> None:
        """
        Set a new environment. Unlike SB3's PPO, the number of environments may change: the rollout and auxiliary
        buffers are then rebuilt (rollouts already in the auxiliary buffer are dropped, with a warning) and the env
        is reset.

        :param env: The environment for learning a policy
        :param force_reset: Force call to ``reset()`` before training
        """
        env = self._wrap_env(env, self.verbose)
        if env.num_envs == self.n_envs:
            super().set_env(env, force_reset=force_reset)
            return
        # Check everything before changing anything
        check_for_correct_spaces(env, self.observation_space, self.action_space)
        self._check_aux_buffer_memory(env.num_envs)
        self.batch_size = resolve_batch_size(self, env.num_envs)
        if self.aux_buffer is not None and self.aux_buffer.n_rollouts > 0:
            warnings.warn(
                f"set_env() changes the number of environments from {self.n_envs} to {env.num_envs}: the "
                f"{self.aux_buffer.n_iterations} policy iterations in the auxiliary buffer are dropped and the next "
                "auxiliary phase waits for n_policy_iters new ones."
            )
        self.n_envs = env.num_envs
        super().set_env(env, force_reset=True)
        self.rollout_buffer = self.rollout_buffer_class(  # type: ignore[misc]
            self.n_steps,
            self.observation_space,  # type: ignore[arg-type]
            self.action_space,
            device=self.device,
            gamma=self.gamma,
            gae_lambda=self.gae_lambda,
            n_envs=self.n_envs,
            **self.rollout_buffer_kwargs,
        )
        self.aux_buffer = self._make_aux_buffer(check_memory=False)

    def save_aux_buffer(self, path: str | pathlib.Path | io.BufferedIOBase) -> None:
        """
        Save the auxiliary buffer, so that a run can resume mid-phase without losing data. It is not part of the
        model zip because it can be many GB. The file holds plain arrays (``.npz`` with JSON metadata and a checksum
        of every array), written atomically; nothing is pickled. For resuming a run exactly, prefer the checkpoints
        of :class:`~sb3_ppg.PPGCheckpointCallback`.

        :param path: Path to the file where the buffer should be saved; ".npz" is appended to a str path without
            a suffix
        """
        if self.aux_buffer is None:
            raise ValueError("This model has no auxiliary buffer (n_aux_epochs=0): there is nothing to save.")
        self.aux_buffer.save(path, self.verbose)

    def load_aux_buffer(self, path: str | pathlib.Path | io.BufferedIOBase) -> None:
        """
        Load an auxiliary buffer saved by ``save_aux_buffer``; the rollouts it holds count toward the next
        auxiliary phase. The file is checked completely (checksums, layout, spaces) before the model's buffer is
        replaced; a pickle or any other file gives a ``ValueError`` and nothing in it is executed.

        :param path: Path to the saved buffer
        """
        if self.aux_buffer is None:
            raise ValueError("This model has no auxiliary buffer (n_aux_epochs=0): it cannot load one.")
        buffer = AuxiliaryBuffer.load(path, self.verbose)
        buffer.check_compatible(self.aux_buffer, path)
        buffer.device = self.device
        self.aux_buffer = buffer
