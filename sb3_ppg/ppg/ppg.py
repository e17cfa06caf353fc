"""Phasic Policy Gradient (Cobbe et al., 2021) as a Stable-Baselines3 on-policy algorithm."""

import io
import os
import pathlib
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, ClassVar, TypeVar

import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, ConvertCallback
from stable_baselines3.common.distributions import Distribution
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, RolloutBufferSamples, Schedule
from stable_baselines3.common.utils import FloatSchedule, check_for_correct_spaces, update_learning_rate
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppg.common import cuda, data_parallel, distributed, optim
from sb3_ppg.common.array_files import atomic_write
from sb3_ppg.common.aux_buffer import (
    AuxiliaryBuffer,
    AuxiliaryBufferSamples,
    aux_buffer_storage,
    aux_buffer_summary,
    make_aux_buffer,
)
from sb3_ppg.common.callbacks import iter_callbacks, rollout_boundary_callbacks
from sb3_ppg.common.checkpoints import RunState, load_checkpoint
from sb3_ppg.common.distributed import RunningStats
from sb3_ppg.common.distributions import get_distribution_params, kl_divergence_from_params, unchecked_distributions
from sb3_ppg.common.hyperparameters import (
    CHECKED_HYPERPARAMETERS,
    REMOVED_OPTIONS,
    check_hyperparameters,
    refuse_removed_options,
    resolve_batch_size,
    resolve_normalize_advantage,
    schedule_value,
    warn_if_no_aux_phase,
)
from sb3_ppg.common.logger import drop_written_values, write_pending_values
from sb3_ppg.common.precision import PRECISION_NAMES, has_convolutions, resolve_micro_batch_size, resolve_precision
from sb3_ppg.common.preprocessing import checked_env
from sb3_ppg.common.progress_bar import AuxPhaseCallback, PPGProgressBarCallback
from sb3_ppg.common.reward_normalization import RolloutRewardNormalizer, check_reward_normalization
from sb3_ppg.common.rollout import RolloutAlgorithm
from sb3_ppg.common.rollout_buffers import PPGDictRolloutBuffer, PPGRolloutBuffer, env_minibatches, rollout_explained_variance
from sb3_ppg.common.save_util import (
    RUN_LAYOUT_HYPERPARAMETERS,
    SavedPolicyClass,
    check_model_zip,
    check_run_layout,
    load_errors,
    zip_destination,
)
from sb3_ppg.ppg import losses
from sb3_ppg.ppg.losses import Diagnostics, PhaseStats
from sb3_ppg.ppg.policies import CnnPolicy, MlpPolicy, MultiInputPolicy, PPGPolicy, ProcgenCnn

SelfPPG = TypeVar("SelfPPG", bound="PPG")


class PPG(RolloutAlgorithm):
    """
    Phasic Policy Gradient (PPG)

    Paper: https://arxiv.org/abs/2009.04416
    Code: https://github.com/openai/phasic-policy-gradient
    Introduction and parameters: docs/ppg.md (the presets of the paper and CleanRL: docs/hyperparams.md)

    :param policy: The policy model to use (MlpPolicy, CnnPolicy, MultiInputPolicy, ProcgenCnn, ...)
    :param env: The environment to learn from (if registered in Gym, can be str)
    :param learning_rate: The learning rate, a constant or a function of the remaining progress (from 1 to 0)
    :param n_steps: The number of steps to run for each environment per update
    :param batch_size: Policy-phase minibatch size; ``None``: 8 minibatches per rollout (the paper's)
    :param policy_minibatches: ``"transitions"`` (SB3's PPO) or ``"envs"`` (whole env rollouts, the paper's code)
    :param n_epochs: Policy epochs per iteration (E_pi)
    :param n_value_epochs: Value epochs per iteration (E_V); ``None``: ``n_epochs``, joint with the policy epochs
    :param gamma: Discount factor
    :param gae_lambda: Factor for trade-off of bias vs variance for Generalized Advantage Estimator
    :param clip_range: Clipping parameter of the surrogate objective (constant or schedule); ``None``: no clipping
    :param clip_range_vf: Clipping parameter of the policy phase's value function; ``None``: no value clipping
    :param value_clipping: The form of the clipped value loss: ``"sb3"`` (SB3's PPO) or ``"max"`` (CleanRL's)
    :param normalize_advantage: ``"batch"`` (the paper's), ``"minibatch"`` (SB3's PPO) or ``"none"``
    :param normalize_reward: Scale each finished rollout's rewards as the paper's code (``RolloutRewardNormalizer``;
        the preset "paper" does), instead of a ``VecNormalize`` that normalizes rewards
    :param reward_normalizer_kwargs: Its ``gamma`` (0.99), ``clip_reward`` (10) and ``epsilon`` (1e-8)
    :param ent_coef: Entropy coefficient of the policy loss
    :param vf_coef: Value function coefficient of the policy phase
    :param max_grad_norm: The maximum value for gradient clipping (both phases); ``None``: no clipping
    :param kl_coef: Coefficient of the KL penalty of the policy loss (the paper's "ppgkl": 1.0)
    :param n_policy_iters: Policy iterations (rollouts) per auxiliary phase (N_pi)
    :param n_aux_epochs: Epochs of each auxiliary phase (E_aux); 0: no auxiliary phase (PPO)
    :param aux_batch_rollouts: Whole env rollouts per auxiliary minibatch
    :param beta_clone: Weight of the behaviour-cloning KL of the auxiliary phase
    :param vf_true_coef: Weight of the value network's loss in the auxiliary phase
    :param aux_learning_rate: Learning rate of the auxiliary phase (constant or schedule); ``None``: ``learning_rate``
    :param separate_aux_optimizer: Whether the auxiliary phase has its own optimizer (the paper's code)
    :param n_aux_grad_accum: Auxiliary minibatches whose gradients are accumulated per optimizer step
    :param aux_buffer_device: Where the auxiliary buffer lives: ``"cpu"``, ``"pinned"``, ``"device"`` or ``"auto"``
    :param cuda_graphs: Replay the rollout's forward pass from CUDA graphs on a CUDA device (the same results)
    :param parallel_networks: Run ``arch="dual"``'s two networks on two CUDA streams on a CUDA device (the same results)
    :param micro_batch_size: The most samples per forward and backward pass; ``"auto"``: 256 for a CNN on a CPU
    :param precision: The features extractors' precision: ``"auto"``, ``"fp32"``, ``"bf16"`` or a dict per phase
    :param use_sde: Whether to use generalized State Dependent Exploration (gSDE) instead of action noise exploration
    :param sde_sample_freq: Sample a new noise matrix every n steps when using gSDE (-1: only at rollout start)
    :param rollout_buffer_class: Rollout buffer class to use. If ``None``, it will be automatically selected.
    :param rollout_buffer_kwargs: Keyword arguments to pass to the rollout buffer on creation.
    :param target_kl: Limit the KL divergence between updates of the policy phase (early stopping, as SB3's PPO)
    :param stats_window_size: Window size for the rollout logging (episodes averaged)
    :param tensorboard_log: the log location for tensorboard (if None, no logging)
    :param policy_kwargs: additional arguments to be passed to the policy on creation (e.g. ``arch``)
    :param verbose: Verbosity level: 0 for no output, 1 for info messages, 2 for debug messages
    :param seed: Seed for the pseudo random generators
    :param device: Device (cpu, cuda, ...) on which the code should be run
    :param _init_setup_model: Whether or not to build the network at the creation of the instance
    :param kwargs: Refused: an option removed from PPG with what replaced it (``REMOVED_OPTIONS``), another as Python does
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MlpPolicy,
        "CnnPolicy": CnnPolicy,
        "MultiInputPolicy": MultiInputPolicy,
        "ProcgenCnn": ProcgenCnn,
        "ProcgenCnnPolicy": ProcgenCnn,
    }
    aux_buffer_class: ClassVar[type[AuxiliaryBuffer]] = AuxiliaryBuffer  # RecurrentPPG's keeps start states too
    fused_adam_on_cpu: ClassVar[bool] = False  # Adam's fused kernel on a CPU too (RecurrentPPG's; docs/throughput.md)
    policy: PPGPolicy
    rollout_buffer: RolloutBuffer
    max_grad_norm: float | None  # type: ignore[assignment]

    def __init__(
        self,
        policy: str | type[PPGPolicy],
        env: GymEnv | str,
        learning_rate: float | Schedule = 5e-4,
        n_steps: int = 256,
        batch_size: int | None = None,
        policy_minibatches: str = "transitions",
        n_epochs: int = 1,
        n_value_epochs: int | None = None,
        gamma: float = 0.999,
        gae_lambda: float = 0.95,
        clip_range: float | Schedule | None = 0.2,
        clip_range_vf: float | Schedule | None = None,
        value_clipping: str = "sb3",
        normalize_advantage: str | bool = "batch",
        normalize_reward: bool = False,
        reward_normalizer_kwargs: dict[str, Any] | None = None,
        ent_coef: float = 0.01,
        vf_coef: float = 0.5,
        max_grad_norm: float | None = None,
        kl_coef: float = 0.0,
        n_policy_iters: int = 32,
        n_aux_epochs: int = 6,
        aux_batch_rollouts: int = 4,
        beta_clone: float = 1.0,
        vf_true_coef: float = 1.0,
        aux_learning_rate: float | Schedule | None = None,
        separate_aux_optimizer: bool = True,
        n_aux_grad_accum: int = 1,
        aux_buffer_device: str = "auto",
        cuda_graphs: bool = True,
        parallel_networks: bool = True,
        micro_batch_size: int | str | None = "auto",
        precision: str | dict[str, str] = "auto",
        use_sde: bool = False,
        sde_sample_freq: int = -1,
        rollout_buffer_class: type[RolloutBuffer] | None = None,
        rollout_buffer_kwargs: dict[str, Any] | None = None,
        target_kl: float | None = None,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: th.device | str = "auto",
        _init_setup_model: bool = True,
        **kwargs: Any,
    ):
        refuse_removed_options(type(self).__name__, kwargs)
        super().__init__(
            policy,
            env,
            learning_rate=learning_rate,
            n_steps=n_steps,
            gamma=gamma,
            gae_lambda=gae_lambda,
            ent_coef=ent_coef,
            vf_coef=vf_coef,
            max_grad_norm=max_grad_norm,  # type: ignore[arg-type]
            use_sde=use_sde,
            sde_sample_freq=sde_sample_freq,
            rollout_buffer_class=rollout_buffer_class,
            rollout_buffer_kwargs=rollout_buffer_kwargs,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            policy_kwargs=policy_kwargs,
            verbose=verbose,
            device=distributed.auto_init(device),
            seed=seed,
            _init_setup_model=False,
            supported_action_spaces=(spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary),
        )
        self.batch_size = batch_size
        self.policy_minibatches = policy_minibatches
        self.n_epochs = n_epochs
        self.n_value_epochs = n_epochs if n_value_epochs is None else n_value_epochs
        self.clip_range = clip_range
        self.clip_range_vf = clip_range_vf
        self.value_clipping = value_clipping
        self.normalize_advantage = resolve_normalize_advantage(normalize_advantage)
        self.normalize_reward = normalize_reward
        self.reward_normalizer_kwargs = reward_normalizer_kwargs
        self.kl_coef = kl_coef
        self.target_kl = target_kl
        self.n_policy_iters = n_policy_iters
        self.n_aux_epochs = n_aux_epochs
        self.aux_batch_rollouts = aux_batch_rollouts
        self.beta_clone = beta_clone
        self.vf_true_coef = vf_true_coef
        self.aux_learning_rate = aux_learning_rate
        self.separate_aux_optimizer = separate_aux_optimizer
        self.n_aux_grad_accum = n_aux_grad_accum
        self.aux_buffer_device = aux_buffer_device
        self.cuda_graphs = cuda_graphs
        self.parallel_networks = parallel_networks
        self.micro_batch_size = micro_batch_size
        self.precision = precision
        self._written_logs: dict[str, Any] = {}  # the last train()'s values, written when learn() returned
        # Cumulative counters: saved with the model
        self._n_aux_phases = 0
        self._n_aux_updates = 0
        # batch_size=None follows n_envs (8 minibatches), also after load() or set_env() with another n_envs
        self._auto_batch_size = batch_size is None
        # Built by _setup_model: the auxiliary buffer (None without auxiliary phase), the extra optimizers, the
        # features extractors' dtype in each phase and the micro-batch size
        self.aux_buffer: AuxiliaryBuffer | None = None
        self.aux_optimizer: th.optim.Optimizer | None = None
        self.value_optimizer: th.optim.Optimizer | None = None
        # The paper code's reward normalization of each rollout (normalize_reward), saved with the model
        self.reward_normalizer: RolloutRewardNormalizer | None = None
        self._phase_dtypes: dict[str, th.dtype] = {}
        self._micro_batch_size: int | None = None
        # Where the auxiliary buffer lives (see aux_buffer_device) and why, for the log
        self._aux_buffer_storage: tuple[str, str] = ("host", "")
        # False from the start of a rollout until its train() returns, so also after an exception (Ctrl-C) inside
        # either: see at_rollout_boundary
        self._at_rollout_boundary = True
        # Data-parallel training: the VecNormalize statistics every rank started the current rollout from
        self._data_parallel_stats: dict[str, RunningStats] = {}
        # During train() on CUDA, the rollout copied to the device (see train())
        self._device_rollout: cuda.DeviceRollout | None = None
        self._check_hyperparameters()

        if _init_setup_model:
            self._setup_model()

    # ------------------------------------------------------------------------------------------------------------
    # Construction: hyperparameters, networks, buffers, optimizers
    # ------------------------------------------------------------------------------------------------------------

    def _check_hyperparameters(self) -> None:
        """Check the hyperparameters that do not depend on the env (``check_hyperparameters``); NumPy ints become ints."""
        checked = check_hyperparameters({name: getattr(self, name) for name in CHECKED_HYPERPARAMETERS})
        for name, value in checked.items():
            setattr(self, name, value)

    def _setup_model(self) -> None:
        # PPG.load() sets the saved hyperparameters (and those given to load()) before this call: check them as the
        # constructor does, before anything is built from them
        if isinstance(self.policy_class, SavedPolicyClass):
            self.policy_class = self.policy_class.policy_class
        self.normalize_advantage = resolve_normalize_advantage(self.normalize_advantage)
        self._check_hyperparameters()
        check_reward_normalization(self.normalize_reward, self.env)
        if self.rollout_buffer_class is None:
            dict_obs = isinstance(self.observation_space, spaces.Dict)
            self.rollout_buffer_class = PPGDictRolloutBuffer if dict_obs else PPGRolloutBuffer
        super()._setup_model()
        self.clip_range = FloatSchedule(self.clip_range) if self.clip_range is not None else None  # type: ignore[assignment]
        self.clip_range_vf = FloatSchedule(self.clip_range_vf) if self.clip_range_vf is not None else None  # type: ignore[assignment]
        if self.aux_learning_rate is not None:
            self.aux_learning_rate = FloatSchedule(self.aux_learning_rate)
        self.batch_size = self._resolve_batch_size(self.n_envs)
        # The features extractors' precision in each phase; between train() calls (rollouts, predict) the rollouts'
        self._phase_dtypes = resolve_precision(self.precision, self.device, has_convolutions(self.policy))
        self.policy.compute_dtype = self._phase_dtypes["rollout"]
        self.policy.rollout_cuda_graphs = self.cuda_graphs
        self.policy.parallel_networks = self.parallel_networks
        self._micro_batch_size = resolve_micro_batch_size(self.micro_batch_size, self.device, has_convolutions(self.policy))
        # The auxiliary buffer is not saved with the model: a loaded model starts a new phase
        self.aux_buffer = self._make_aux_buffer()
        # The aux phase's own Adam (the paper's code) unless it shares the policy phase's (CleanRL); separate value
        # epochs (E_V != E_pi) step a second Adam of their own, as the paper's code does
        self.aux_optimizer = self._make_optimizer() if self.n_aux_epochs > 0 and self.separate_aux_optimizer else None
        self.value_optimizer = self._make_optimizer() if self.n_value_epochs != self.n_epochs else None
        self._configure_optimizers()
        if self.normalize_reward:
            self.reward_normalizer = RolloutRewardNormalizer(self.n_envs, **(self.reward_normalizer_kwargs or {}))

    # ------------------------------------------------------------------------------------------------------------
    # Training: one iteration of Algorithm 1 per rollout
    # ------------------------------------------------------------------------------------------------------------

    def train(self) -> None:
        """One PPG iteration on the rollout just collected (Algorithm 1's inner loop; see docs/ppg.md)."""
        self.policy.set_training_mode(True)
        if self.normalize_advantage == "batch":
            self._normalize_advantages()
        # On CUDA the rollout is copied to the device once: the policy phase's epochs gather their minibatches there
        # and the auxiliary buffer stores it from there (its arrays as they are now: after the advantages' update)
        on_device = cuda.gathers_on_device(self.rollout_buffer, self.device)
        self._device_rollout = cuda.rollout_to_device(self.rollout_buffer, self.device) if on_device else None
        try:
            with unchecked_distributions(self.policy.action_dist):
                with self._precision("policy"):
                    self._policy_phase()
                if self.aux_buffer is not None:
                    if self.aux_buffer.full():
                        self._device_rollout = None  # the device memory free for that phase
                        self._rerun_interrupted_aux_phase()
                    self.aux_buffer.add(self.rollout_buffer, self._device_rollout)
                    self._device_rollout = None  # the device memory free for the auxiliary phase
                    if self.aux_buffer.full():
                        self._aux_phase()
        finally:
            self._device_rollout = None
        self.logger.record("train/n_aux_phases", self._n_aux_phases)
        self._at_rollout_boundary = True

    def _normalize_advantages(self) -> None:
        """Normalize the rollout's advantages once, over all its samples (over all ranks' in data-parallel training)."""
        advantages = self.rollout_buffer.advantages
        if distributed.is_active():
            mean, std = distributed.global_mean_std(advantages)
        else:
            mean, std = advantages.mean(), advantages.std()
        self.rollout_buffer.advantages = (advantages - mean) / (std + 1e-8)

    def _policy_phase(self) -> None:
        """
        The policy phase: PPO on the rollout, joint value epochs or ``n_value_epochs`` value-only epochs first; stopped by
        ``target_kl`` as SB3's PPO.
        """
        progress = self._current_progress_remaining
        self._update_learning_rate(self.policy.optimizer)
        clip_range = self._schedule_value("clip_range", progress)
        clip_range_vf = self._schedule_value("clip_range_vf", progress)
        stats = PhaseStats()
        optimizers = [optimizer for optimizer in (self.policy.optimizer, self.value_optimizer) if optimizer is not None]
        check = cuda.finite_check("policy", self.num_timesteps, optimizers)
        if self.n_value_epochs == self.n_epochs:
            policy_epoch_loss = partial(self._joint_loss, clip_range=clip_range, clip_range_vf=clip_range_vf)
        else:
            assert self.value_optimizer is not None
            update_learning_rate(self.value_optimizer, self.lr_schedule(progress))
            value_loss = partial(self._value_loss, clip_range_vf=clip_range_vf)
            for _ in range(self.n_value_epochs):
                for rollout_data in self._rollout_minibatches():
                    diagnostics, _ = optim.backward(rollout_data, value_loss, self._micro_batch_size, check)
                    stats.add(diagnostics)
                    self._step(self.value_optimizer, check)
                self._n_updates += 1
            policy_epoch_loss = partial(self._policy_loss, clip_range=clip_range)
        continue_training = True
        for _ in range(self.n_epochs):
            for rollout_data in self._rollout_minibatches():
                rollout_data = self._normalize_minibatch_advantages(rollout_data)
                diagnostics, continue_training = optim.backward(
                    rollout_data,
                    policy_epoch_loss,
                    self._micro_batch_size,
                    check,
                    target_kl=self.target_kl,
                    module=self.policy,
                )
                stats.add(diagnostics)
                if not continue_training:
                    break
                self._step(self.policy.optimizer, check)
            self._n_updates += 1
            if not continue_training:
                break
        check.raise_if_skipped()
        self._log_policy_phase(stats, clip_range, clip_range_vf, continue_training)

    def _rollout_minibatches(self) -> Iterator[RolloutBufferSamples]:
        """
        One epoch of the policy phase's minibatches (``policy_minibatches``): shuffled transitions (the rollout
        buffer's ``get``) or whole env rollouts (:func:`~sb3_ppg.common.rollout_buffers.env_minibatches`), gathered on
        the device on CUDA (``sb3_ppg.common.cuda.device_data``).
        """
        on_device = cuda.gathers_on_device(self.rollout_buffer, self.device)
        device_rollout = self._device_rollout  # train()'s copy where it gathers on the device (None: one per epoch)
        if self.policy_minibatches == "envs" and on_device:
            return cuda.device_env_minibatches(
                self.rollout_buffer, self.batch_size, self.device, device_rollout=device_rollout
            )  # type: ignore[return-value]
        if self.policy_minibatches == "envs":
            return env_minibatches(self.rollout_buffer, self.batch_size)  # type: ignore[return-value]
        if on_device:
            return cuda.device_minibatches(self.rollout_buffer, self.batch_size, self.device, device_rollout=device_rollout)  # type: ignore[return-value]
        return self.rollout_buffer.get(self.batch_size)

    def _aux_phase(self) -> None:
        """
        The auxiliary phase on the full buffer: compute the old policy on it, run ``n_aux_epochs`` epochs, empty it.
        When the phase is interrupted (an exception, Ctrl-C) the buffer stays full, so that the model stays usable:
        the next ``train()`` runs the phase again, and the error says how to resume.
        """
        assert self.aux_buffer is not None
        n_batches = -(-self.aux_buffer.n_rollouts // self.aux_batch_rollouts)
        self._notify_aux_phase_callbacks("on_aux_phase_start", self.n_aux_epochs, n_batches)
        try:
            with self._precision("aux"):
                self._compute_old_distributions()
                self._train_aux_phase()
        except BaseException as error:
            if hasattr(error, "add_note"):  # Python 3.11
                error.add_note(
                    f"PPG: interrupted during the auxiliary phase at timestep {self.num_timesteps} (auxiliary phase "
                    f"{self._n_aux_phases + 1}). The model stays usable: learn() again reruns that phase from its start. "
                    "To resume exactly instead, load the last checkpoint written by PPGCheckpointCallback with "
                    "PPG.load_checkpoint(); it is left intact."
                )
            raise
        self.aux_buffer.reset()
        self._notify_aux_phase_callbacks("on_aux_phase_end")

    def _notify_aux_phase_callbacks(self, method: str, *args: int) -> None:
        """Call ``method`` of the :class:`~sb3_ppg.common.progress_bar.AuxPhaseCallback` s of the current ``learn()``."""
        for callback in getattr(self, "_aux_phase_callbacks", ()):
            getattr(callback, method)(*args)

    def _rerun_interrupted_aux_phase(self) -> None:
        """Run an auxiliary phase that an exception (or Ctrl-C) interrupted (the buffer is still full), from its start."""
        warnings.warn(
            "The last auxiliary phase was interrupted: it runs again from its start on the stored rollouts "
            "(the updates it had made are kept) before this iteration's rollout is stored."
        )
        self._aux_phase()

    def _compute_old_distributions(self) -> None:
        """
        Store the current policy's action distribution on every buffered state: the ``pi_old`` that the auxiliary
        phase's behaviour-cloning term keeps the policy close to. One pass without gradients, in chunks.
        """
        assert self.aux_buffer is not None
        with th.inference_mode():
            for rows, observations in self.aux_buffer.iter_rollout_chunks(self.aux_batch_rollouts):
                parts = optim.split_observations(observations, self._micro_batch_size)
                params = [self._distribution_params(self.policy.get_distribution(part)) for part in parts]
                self.aux_buffer.store_old_distribution_params(rows, params[0] if len(params) == 1 else th.cat(params))

    def _distribution_params(self, distribution: Distribution) -> th.Tensor:
        """pi_old's parameters as the auxiliary buffer stores them (a subclass's hook: ``MaskablePPG``'s logits)."""
        return get_distribution_params(distribution)

    def _train_aux_phase(self) -> None:
        """
        The auxiliary phase's epochs: ``n_aux_epochs`` epochs over shuffled minibatches of whole rollouts, minimizing
        ``_aux_loss``, with ``n_aux_grad_accum`` minibatches per optimizer step.
        """
        assert self.aux_buffer is not None
        start_time = time.perf_counter()
        optimizer = self.aux_optimizer if self.aux_optimizer is not None else self.policy.optimizer
        learning_rate = self._schedule_value("aux_learning_rate", self._current_progress_remaining)
        update_learning_rate(optimizer, learning_rate)
        n_batches = -(-self.aux_buffer.n_rollouts // self.aux_batch_rollouts)
        accum = self.n_aux_grad_accum
        stats = PhaseStats()
        check = cuda.finite_check("auxiliary", self.num_timesteps, [optimizer])
        # No gradient of the policy phase may leak into the first step
        optimizer.zero_grad(set_to_none=True)
        for epoch in range(self.n_aux_epochs):
            for batch_index, batch in enumerate(self.aux_buffer.get(self.aux_batch_rollouts)):
                # Average the gradient over the minibatches of one accumulation group (the last may be shorter)
                group_start = batch_index - batch_index % accum
                group_size = min(accum, n_batches - group_start)
                diagnostics, _ = optim.backward(batch, self._aux_loss, self._micro_batch_size, check, divisor=group_size)
                stats.add(diagnostics)
                if batch_index - group_start == group_size - 1:
                    self._step(optimizer, check)
                    self._n_aux_updates += 1
                self._notify_aux_phase_callbacks("on_aux_minibatch", epoch + 1, batch_index + 1)
        check.raise_if_skipped()
        self._n_aux_phases += 1
        values = stats.read()
        for name in ("kl_loss", "aux_value_loss", "real_value_loss"):
            self.logger.record(f"aux/{name}", values.get(name))
        self.logger.record("aux/learning_rate", learning_rate)
        self.logger.record("aux/n_updates", self._n_aux_updates, exclude="tensorboard")
        self.logger.record("time/aux_phase_s", time.perf_counter() - start_time)

    def _step(self, optimizer: th.optim.Optimizer, check: optim.FiniteCheck) -> None:
        """One optimizer step of the policy's parameters (:func:`~sb3_ppg.common.optim.step`), checked by ``check``."""
        optim.step(optimizer, self.policy, self.max_grad_norm, check)

    @contextmanager
    def _precision(self, phase: str) -> Iterator[None]:
        """
        Run the features extractors at ``phase``'s precision inside the context, and at the rollouts' after it (the
        next rollout and ``predict`` run at the rollout precision, whatever happened inside).

        :param phase: ``"policy"`` or ``"aux"``
        """
        self.policy.compute_dtype = self._phase_dtypes[phase]
        try:
            yield
        finally:
            self.policy.compute_dtype = self._phase_dtypes["rollout"]

    # ------------------------------------------------------------------------------------------------------------
    # The losses of a minibatch
    # ------------------------------------------------------------------------------------------------------------

    def _actions(self, rollout_data: RolloutBufferSamples) -> th.Tensor:
        """The minibatch's actions in the form the distribution's ``log_prob`` expects."""
        if isinstance(self.action_space, spaces.Discrete):
            return rollout_data.actions.long().flatten()
        return rollout_data.actions

    def _evaluate_actions(self, rollout_data: RolloutBufferSamples) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        """
        The policy's values, log-probabilities of the minibatch's actions and entropies, one forward pass (a
        subclass's hook: ``MaskablePPG`` applies the minibatch's action masks).
        """
        return self.policy.evaluate_actions(rollout_data.observations, self._actions(rollout_data))

    def _normalize_minibatch_advantages(self, rollout_data: RolloutBufferSamples) -> RolloutBufferSamples:
        """The minibatch with its advantages normalized over it when ``normalize_advantage="minibatch"`` (SB3's PPO)."""
        if self.normalize_advantage != "minibatch":
            return rollout_data
        return rollout_data._replace(advantages=losses.normalize_advantages(rollout_data.advantages))

    def _joint_loss(
        self, rollout_data: RolloutBufferSamples, clip_range: float | None, clip_range_vf: float | None
    ) -> tuple[th.Tensor, Diagnostics]:
        """The policy phase's joint loss (E_V = E_pi): policy loss + ``vf_coef`` * value loss, one forward pass."""
        values, log_prob, entropy = self._evaluate_actions(rollout_data)
        policy_loss, diagnostics = losses.policy_loss(
            rollout_data.advantages, log_prob, rollout_data.old_log_prob, entropy, clip_range, self.ent_coef, self.kl_coef
        )
        value_loss, value_diagnostics = losses.value_loss(
            values.flatten(), rollout_data.returns, rollout_data.old_values, clip_range_vf, self.value_clipping
        )
        return policy_loss + self.vf_coef * value_loss, {**diagnostics, **value_diagnostics}

    def _policy_loss(self, rollout_data: RolloutBufferSamples, clip_range: float | None) -> tuple[th.Tensor, Diagnostics]:
        """The policy loss of a policy epoch (E_V != E_pi; see :func:`~sb3_ppg.ppg.losses.policy_loss`)."""
        _, log_prob, entropy = self._evaluate_actions(rollout_data)
        return losses.policy_loss(
            rollout_data.advantages, log_prob, rollout_data.old_log_prob, entropy, clip_range, self.ent_coef, self.kl_coef
        )

    def _value_loss(self, rollout_data: RolloutBufferSamples, clip_range_vf: float | None) -> tuple[th.Tensor, Diagnostics]:
        """``vf_coef`` * the value loss of a value epoch (E_V != E_pi; see :func:`~sb3_ppg.ppg.losses.value_loss`)."""
        values = self.policy.predict_values(rollout_data.observations)
        value_loss, diagnostics = losses.value_loss(
            values.flatten(), rollout_data.returns, rollout_data.old_values, clip_range_vf, self.value_clipping
        )
        return self.vf_coef * value_loss, diagnostics

    def _aux_loss(self, batch: AuxiliaryBufferSamples) -> tuple[th.Tensor, Diagnostics]:
        """The auxiliary loss of a minibatch, one forward pass (see :func:`~sb3_ppg.ppg.losses.aux_loss_from_kl`)."""
        distribution, values, aux_values = self.policy.forward_aux(batch.observations)
        kl = self._behaviour_cloning_kl(batch, distribution)
        return losses.aux_loss_from_kl(kl, values, aux_values, batch.returns, self.beta_clone, self.vf_true_coef)

    def _behaviour_cloning_kl(self, batch: AuxiliaryBufferSamples, distribution: Distribution) -> th.Tensor:
        """``KL(pi_old || pi)`` per state (a subclass's hook: ``MaskablePPG``'s over the valid actions only)."""
        return kl_divergence_from_params(batch.old_distribution_params, distribution)

    # ------------------------------------------------------------------------------------------------------------
    # Construction helpers: optimizers, auxiliary buffer, batch size
    # ------------------------------------------------------------------------------------------------------------

    def _configure_optimizers(self) -> None:
        """Adam's implementation for the device: torch's fused kernel on CUDA, on a CPU multi-tensor (or fused: the flag)."""
        cuda.configure_optimizers(
            self._optimizers(), self.policy.optimizer_class, self.policy.optimizer_kwargs, self.device, self.fused_adam_on_cpu
        )

    def set_parameters(self, *args: Any, **kwargs: Any) -> None:
        """SB3's; then the optimizers' implementation for this device (``_configure_optimizers``)."""
        super().set_parameters(*args, **kwargs)
        self._configure_optimizers()

    def _resolve_batch_size(self, n_envs: int) -> int:
        """The policy-phase minibatch size for ``n_envs`` envs, checked (see ``resolve_batch_size``)."""
        return resolve_batch_size(
            None if self._auto_batch_size else self.batch_size,
            self.n_steps,
            n_envs,
            self.normalize_advantage,  # type: ignore[arg-type]
            self.n_aux_epochs,
            self.n_policy_iters,
            self.aux_batch_rollouts,
            self.policy_minibatches,
        )

    def _make_aux_buffer(self, check_memory: bool = True) -> AuxiliaryBuffer | None:
        """The auxiliary buffer for the current ``n_envs`` (None when the auxiliary phase is off); see above."""
        storage = self._check_aux_buffer_memory(self.n_envs) if check_memory else self._aux_buffer_storage
        if self.n_aux_epochs == 0:
            return None
        layout = (self.n_policy_iters, self.n_steps, self.n_envs, self.observation_space, self.action_space)
        buffer, self._aux_buffer_storage = make_aux_buffer(
            *layout, self.device, storage, self.aux_buffer_class, **self._aux_buffer_kwargs()
        )
        return buffer

    def _check_aux_buffer_memory(self, n_envs: int) -> tuple[str, str]:
        """Where the auxiliary buffer for ``n_envs`` envs lives and why (see ``aux_buffer_storage``)."""
        if self.n_aux_epochs == 0:
            return "host", ""
        layout = (self.n_policy_iters, self.n_steps, n_envs, self.observation_space, self.action_space)
        where = (self.aux_buffer_device, self.device, self.aux_buffer_class)
        return aux_buffer_storage(*layout, *where, **self._aux_buffer_kwargs())

    def _aux_buffer_kwargs(self) -> dict[str, Any]:
        """
        The auxiliary buffer's arguments beyond its layout and spaces (a subclass's hook: ``MaskablePPG`` stores the
        action masks and its distributions' parameters); PPG's are the buffer's defaults.
        """
        return {}

    def _make_optimizer(self) -> th.optim.Optimizer:
        """A new optimizer over all policy parameters, of the policy optimizer's class and settings."""
        return self.policy.optimizer_class(self.policy.parameters(), lr=self.lr_schedule(1), **self.policy.optimizer_kwargs)  # type: ignore[call-arg]

    # ------------------------------------------------------------------------------------------------------------
    # Schedules and logging
    # ------------------------------------------------------------------------------------------------------------

    def _schedule_value(self, name: str, progress_remaining: float) -> float | None:
        """
        The value at ``progress_remaining`` of the schedule ``name`` (``"learning_rate"``, ``"aux_learning_rate"``,
        the learning rate's when None, ``"clip_range"``, ``"clip_range_vf"``), checked; None for a clip range of None.
        """
        schedule = self.lr_schedule if name == "learning_rate" else getattr(self, name)
        if name == "aux_learning_rate" and schedule is None:
            name, schedule = "learning_rate", self.lr_schedule
        return None if schedule is None else schedule_value(schedule, name, progress_remaining)

    def _update_current_progress_remaining(self, num_timesteps: int, total_timesteps: int) -> None:
        """SB3's remaining progress, kept at 0 once the total is reached (the last rollout may end beyond it)."""
        self._current_progress_remaining = max(0.0, 1.0 - float(num_timesteps) / float(total_timesteps))

    def _update_learning_rate(self, optimizers: list[th.optim.Optimizer] | th.optim.Optimizer) -> None:
        """SB3's learning-rate update, after checking the schedule's value (a ``ValueError`` names a bad one)."""
        self._schedule_value("learning_rate", self._current_progress_remaining)
        super()._update_learning_rate(optimizers)

    def _log_policy_phase(
        self, stats: PhaseStats, clip_range: float | None, clip_range_vf: float | None, continue_training: bool
    ) -> None:
        """Record the policy phase's diagnostics: means over its minibatches, the last minibatch's loss (read at once)."""
        values = stats.read()
        for name in ("entropy_loss", "policy_gradient_loss", "value_loss", "approx_kl", "clip_fraction", "kl_penalty"):
            if (mean := values.get(name)) is not None:
                self.logger.record(f"train/{name}", mean)
        explained_var = rollout_explained_variance(self.rollout_buffer)
        self.logger.record("train/loss", values.get("last_loss"))
        self.logger.record("train/explained_variance", explained_var)
        if hasattr(self.policy, "log_std"):
            self.logger.record("train/std", th.exp(self.policy.log_std).mean().item())
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        if clip_range is not None:
            self.logger.record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", clip_range_vf)
        if not continue_training and self.verbose >= 1:
            print(f"Early stopping of the policy phase: approx_kl reached 1.5 * target_kl = {1.5 * self.target_kl:.4f}")  # type: ignore[operator]

    # ------------------------------------------------------------------------------------------------------------
    # learn(): SB3's, which collects a rollout and calls train(); its hooks for data-parallel training
    # ------------------------------------------------------------------------------------------------------------

    def learn(
        self: SelfPPG,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "PPG",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfPPG:
        """
        SB3's ``learn()``, with PPG's TensorBoard run name (``PPG_1``, ...). The values of its last ``train()`` (its
        auxiliary phase's included) are written at the end, which SB3's leaves out.
        """
        super().learn(
            total_timesteps=total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=tb_log_name,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )
        if log_interval is not None:
            self._written_logs = write_pending_values(self.logger, self.num_timesteps)
        return self

    def _setup_learn(
        self,
        total_timesteps: int,
        callback: MaybeCallback = None,
        reset_num_timesteps: bool = True,
        tb_log_name: str = "run",
        progress_bar: bool = False,
    ) -> tuple[int, BaseCallback]:
        """SB3's; in data-parallel training, the ranks first check that they agree and take rank 0's state."""
        if distributed.is_active():
            aux_rollouts = self.aux_buffer.n_rollouts if self.aux_buffer is not None else None
            fingerprint = data_parallel.fingerprint(
                self, self._optimizers(), aux_rollouts, total_timesteps, reset_num_timesteps, callback
            )
            self._data_parallel_stats = data_parallel.prepare_learn(self, self._optimizers(), fingerprint)
        if self._written_logs and hasattr(self, "_logger"):
            drop_written_values(self.logger, self._written_logs)  # written at the end of the last learn()
        self._written_logs = {}
        start_timesteps = 0 if reset_num_timesteps else self.num_timesteps
        total_timesteps, callback = super()._setup_learn(
            total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
        )
        if self.aux_buffer is not None and distributed.get_rank() == 0:
            if reset_num_timesteps:
                self.logger.info(
                    aux_buffer_summary(self.aux_buffer, self._next_aux_phase_step(), *self._aux_buffer_storage, self.device)
                )
            given_timesteps, world_size = total_timesteps - start_timesteps, distributed.get_world_size()
            warn_if_no_aux_phase(self, given_timesteps, total_timesteps, self._next_aux_phase_step(), world_size)
        return total_timesteps, callback

    def _next_aux_phase_step(self) -> int:
        """The step at which the next auxiliary phase runs: once the auxiliary buffer is full (in ``train()``)."""
        assert self.aux_buffer is not None
        n_rollouts = max(1, self.n_policy_iters - self.aux_buffer.n_iterations)
        return self.num_timesteps + n_rollouts * self.n_steps * self.n_envs * distributed.get_world_size()

    def _init_callback(self, callback: MaybeCallback, progress_bar: bool = False) -> BaseCallback:
        """
        SB3's, with PPG's progress bar (:class:`~sb3_ppg.common.progress_bar.PPGProgressBarCallback`, which shows the
        auxiliary phases); in data-parallel training with the callbacks that count every rank's steps.
        """
        if distributed.is_active():
            return super()._init_callback(data_parallel.wrap_callback(callback, progress_bar))
        if progress_bar:
            if isinstance(callback, list):
                callback = CallbackList(callback)
            elif not isinstance(callback, BaseCallback):
                callback = ConvertCallback(callback)
            callback = CallbackList([callback, PPGProgressBarCallback()])
        return super()._init_callback(callback)

    def set_random_seed(self, seed: int | None = None) -> None:
        """Seed the generators; in data-parallel training rank ``r`` uses ``seed + r * n_envs`` (distinct env seeds)."""
        if seed is not None and distributed.is_active():
            seed += distributed.get_rank() * self.n_envs
        super().set_random_seed(seed)

    def collect_rollouts(
        self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int
    ) -> bool:
        """
        SB3's ``collect_rollouts()`` (``_collect_rollout``, :class:`~sb3_ppg.common.rollout.RolloutAlgorithm`'s), after
        calling the ``RolloutBoundaryCallback`` s; in data-parallel training, the ranks then share its outcome.
        """
        for boundary_callback in rollout_boundary_callbacks(callback):
            boundary_callback.on_rollout_boundary()
        # Told of the auxiliary phase's progress by train() (which is not given the callbacks)
        self._aux_phase_callbacks = [child for child in iter_callbacks(callback) if isinstance(child, AuxPhaseCallback)]
        self._at_rollout_boundary = False  # until train() has consumed this rollout
        if not distributed.is_active():
            return self._collect_rollout(env, callback, rollout_buffer, n_rollout_steps)
        complete, self._data_parallel_stats = data_parallel.collect_rollouts(
            self,
            partial(self._collect_rollout, env, callback, rollout_buffer, n_rollout_steps),
            self._data_parallel_stats,
        )
        return complete

    def _process_rollout_rewards(self, rollout_buffer: RolloutBuffer) -> None:
        """With ``normalize_reward``: scale the finished rollout's rewards in place, before its returns and advantages."""
        if self.reward_normalizer is not None:
            rollout_buffer.rewards[:] = self.reward_normalizer.normalize(rollout_buffer.rewards, rollout_buffer.episode_starts)

    def _optimizers(self) -> list[th.optim.Optimizer]:
        """The model's optimizers: the policy phase's, then the auxiliary phase's and the value epochs' (if any)."""
        optimizers = (self.policy.optimizer, self.aux_optimizer, self.value_optimizer)
        return [optimizer for optimizer in optimizers if optimizer is not None]

    # ------------------------------------------------------------------------------------------------------------
    # Run state: what checkpoints and data-parallel training read and write
    # ------------------------------------------------------------------------------------------------------------

    @property
    def n_aux_phases(self) -> int:
        """The number of auxiliary phases the model has run (saved with it)."""
        return self._n_aux_phases

    @property
    def phase_precision(self) -> dict[str, str]:
        """The features extractors' precision in each phase (``"fp32"`` or ``"bf16"``), with ``"auto"`` resolved."""
        return {phase: PRECISION_NAMES[dtype] for phase, dtype in self._phase_dtypes.items()}

    @property
    def at_rollout_boundary(self) -> bool:
        """
        Whether the model is at a rollout boundary: ``train()`` has consumed the last rollout collected (or none was
        collected yet). False from the start of a rollout until its ``train()`` returns, so also after an exception
        (Ctrl-C) inside either: ``PPGCheckpointCallback`` writes a checkpoint only at a boundary.
        """
        return self._at_rollout_boundary

    def get_run_state(self) -> RunState:
        """Where the run is, beyond its weights and optimizers (the model's arrays, not copies)."""
        return RunState.of(self)

    def set_run_state(self, state: RunState) -> None:
        """Put back a run state from :meth:`get_run_state` (``PPG.load_checkpoint`` does)."""
        state.restore(self)

    # ------------------------------------------------------------------------------------------------------------
    # Persistence: SB3's save, load and set_env; checkpoints; the auxiliary buffer on disk
    # ------------------------------------------------------------------------------------------------------------

    def save(
        self,
        path: str | pathlib.Path | io.BufferedIOBase,
        exclude: Iterable[str] | None = None,
        include: Iterable[str] | None = None,
    ) -> None:
        """
        SB3's ``save``, atomic for a path; the policy class is wrapped in a :class:`SavedPolicyClass`. Only rank 0 writes.

        :param path: path to the file where the model should be saved, or a writable binary file object
        :param exclude: name of parameters that should be excluded in addition to the default ones
        :param include: name of parameters that might be excluded but should be included anyway
        """
        if distributed.get_rank() != 0:
            return
        if isinstance(path, (str, pathlib.Path)):
            destination = zip_destination(path)
            destination.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(destination, lambda file: self._write_zip(file, exclude, include))
        else:
            self._write_zip(path, exclude, include)

    def _write_zip(
        self, file: io.BufferedIOBase, exclude: Iterable[str] | None = None, include: Iterable[str] | None = None
    ) -> None:
        """Write the model zip (SB3's format) to a file object, with the policy class wrapped (see ``save``)."""
        policy_class = self.policy_class
        self.policy_class = SavedPolicyClass(policy_class)  # type: ignore[assignment]
        try:
            super().save(file, exclude=exclude, include=include)
        finally:
            self.policy_class = policy_class

    @classmethod
    def load(  # type: ignore[override]
        cls: type[SelfPPG],
        path: str | pathlib.Path | io.BufferedIOBase,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> SelfPPG:
        """
        SB3's ``load``, its hyperparameters checked as the constructor's (see docs/differences_from_ppo.md).

        :param path: path to the file (".zip" is tried after the path as given), or a readable binary file object
        :param env: the environment to run the loaded model on (None: prediction only)
        :param device: the device of the model
        :param custom_objects: objects that replace those of the file with the same names (see SB3's ``load``)
        :param print_system_info: whether to print the system info of the saved model and of this system
        :param force_reset: reset the env before training (SB3's default) rather than continuing its last observation
        :param kwargs: hyperparameters (or other attributes) that replace the file's
        :return: the model
        """
        arguments = check_model_zip(path, cls, PPGPolicy, custom_objects, kwargs)
        with load_errors(path, kwargs, custom_objects):
            model = super().load(
                path,
                env=env,
                device=device,
                custom_objects=custom_objects,
                print_system_info=print_system_info,
                force_reset=force_reset,
                **arguments,
            )
        for name in REMOVED_OPTIONS:  # stored by an earlier version
            vars(model).pop(name, None)
        return model

    @classmethod
    def load_checkpoint(
        cls: type[SelfPPG],
        path: str | os.PathLike,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        allow_pickle: bool = True,
        **kwargs: Any,
    ) -> SelfPPG:
        """
        Load a checkpoint written by :class:`~sb3_ppg.PPGCheckpointCallback`, every file checked against its manifest first,
        ready to continue the run (see docs/checkpoints.md, also on pickles).

        :param path: a checkpoint folder, or the callback's ``save_path`` (then its newest checkpoint that verifies)
        :param env: the env to continue with, built as in the run; its envs' states are restored. ``None``: no env
        :param device: the device of the model
        :param allow_pickle: False: unpickle nothing (the zip's pickled objects are rebuilt from plain descriptions)
        :param kwargs: passed to :meth:`load`; ``n_steps`` and ``n_policy_iters`` cannot change
        :return: the model
        """
        layout = {name: kwargs.pop(name) for name in RUN_LAYOUT_HYPERPARAMETERS if name in kwargs}
        model = load_checkpoint(cls, path, env=env, device=device, allow_pickle=allow_pickle, **kwargs)
        check_run_layout(path, layout, model)
        return model  # type: ignore[return-value]

    def _excluded_save_params(self) -> list[str]:
        excluded = ["aux_buffer", "aux_optimizer", "value_optimizer", "reward_normalizer", "_data_parallel_stats"]
        excluded += ["_at_rollout_boundary", "_aux_buffer_storage", "_aux_phase_callbacks", "_device_rollout", "_written_logs"]
        return [*super()._excluded_save_params(), *excluded]

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        optional = [
            name for name in ("aux_optimizer", "value_optimizer", "reward_normalizer") if getattr(self, name) is not None
        ]
        return ["policy", "policy.optimizer", *optional], []

    def _maybe_recommend_cpu(self, mlp_class_name: str = "PPGPolicy") -> None:
        super()._maybe_recommend_cpu(mlp_class_name)

    @staticmethod
    def _wrap_env(env: GymEnv, verbose: int = 0, monitor_wrapper: bool = True) -> VecEnv:
        """SB3's wrapping of the env, after checking its spaces (and an integer Box env's first observation)."""
        return RolloutAlgorithm._wrap_env(checked_env(env), verbose, monitor_wrapper)

    def set_env(self, env: GymEnv, force_reset: bool = True) -> None:
        """
        Set a new environment; unlike SB3's PPO, the number of envs may change (the buffers are then rebuilt, empty).

        :param env: The environment for learning a policy
        :param force_reset: Force call to ``reset()`` before training
        """
        env = self._wrap_env(env, self.verbose)
        check_reward_normalization(self.normalize_reward, env)
        if env.num_envs == self.n_envs:
            super().set_env(env, force_reset=force_reset)
            return
        # Check everything before changing anything
        check_for_correct_spaces(env, self.observation_space, self.action_space)
        self._aux_buffer_storage = self._check_aux_buffer_memory(env.num_envs)
        self.batch_size = self._resolve_batch_size(env.num_envs)
        if self.aux_buffer is not None and self.aux_buffer.n_rollouts > 0:
            warnings.warn(
                f"set_env() changes the number of environments from {self.n_envs} to {env.num_envs}: the "
                f"{self.aux_buffer.n_iterations} policy iterations in the auxiliary buffer are dropped and the next "
                "auxiliary phase waits for n_policy_iters new ones."
            )
        self.n_envs = env.num_envs
        super().set_env(env, force_reset=True)
        self.rollout_buffer = self._make_rollout_buffer()
        self.aux_buffer = self._make_aux_buffer(check_memory=False)
        if self.reward_normalizer is not None:
            self.reward_normalizer.reset_running_return(self.n_envs)

    def save_aux_buffer(self, path: str | pathlib.Path | io.BufferedIOBase) -> None:
        """
        Save the auxiliary buffer (not part of the model zip) as plain arrays, checksummed, written atomically.

        :param path: Path to the file; ".npz" is appended to a str path without a suffix
        """
        if self.aux_buffer is None:
            raise ValueError("This model has no auxiliary buffer (n_aux_epochs=0): there is nothing to save.")
        self.aux_buffer.save(path, self.verbose)

    def load_aux_buffer(self, path: str | pathlib.Path | io.BufferedIOBase) -> None:
        """
        Load an auxiliary buffer saved by ``save_aux_buffer``, checked completely first (a pickle is refused).

        :param path: Path to the saved buffer
        """
        if self.aux_buffer is None:
            raise ValueError("This model has no auxiliary buffer (n_aux_epochs=0): it cannot load one.")
        # Loaded into CPU memory, then copied into the model's buffer (which may live elsewhere: aux_buffer_device)
        self.aux_buffer.copy_from(self.aux_buffer_class.load(path, self.verbose), path)
