"""Phasic Policy Gradient (Cobbe et al., 2021) as a Stable-Baselines3 on-policy algorithm."""

import io
import pathlib
import time
import warnings
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.save_util import load_from_pkl, save_to_pkl
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.utils import (
    FloatSchedule,
    check_for_correct_spaces,
    explained_variance,
    update_learning_rate,
)
from torch.nn import functional as F

from sb3_ppg.buffers import AuxiliaryBuffer
from sb3_ppg.policies import (
    CnnPolicy,
    MlpPolicy,
    MultiInputPolicy,
    PPGPolicy,
    ProcgenCnn,
    kl_divergence_from_params,
)

SelfPPG = TypeVar("SelfPPG", bound="PPG")

ADVANTAGE_NORMALIZATIONS = ("batch", "minibatch", "none")


class PPG(OnPolicyAlgorithm):
    """
    Phasic Policy Gradient (PPG).

    Paper: https://arxiv.org/abs/2009.04416 (Cobbe, Hilton, Klimov, Schulman, ICML 2021).
    Reference code: https://github.com/openai/phasic-policy-gradient

    Training alternates two phases. The **policy phase** is a PPO update on each fresh rollout (``n_epochs``
    policy epochs and ``n_value_epochs`` value epochs). Each rollout is also stored, env by env, as whole
    rollouts in an ``AuxiliaryBuffer``. Every ``n_policy_iters`` rollouts the **auxiliary phase** runs
    ``n_aux_epochs`` epochs over that buffer, minimizing
    ``beta_clone * KL(pi_old || pi) + 0.5 * MSE(aux_value, target) + vf_true_coef * 0.5 * MSE(value, target)``,
    where ``pi_old`` is the policy right before the phase and the targets are the GAE returns of each rollout.
    With ``n_aux_epochs=0`` this is PPO (the paper's baseline, with ``policy_kwargs=dict(arch="shared")``).

    Defaults are the paper's (Procgen) values; see the docs for presets.

    :param policy: The policy model to use (MlpPolicy, CnnPolicy, MultiInputPolicy, ProcgenCnn, ...)
    :param env: The environment to learn from (if registered in Gym, can be str)
    :param learning_rate: The learning rate of the policy phase, a constant or a function of the remaining
        progress (from 1 to 0)
    :param n_steps: The number of steps to run for each environment per update (rollout length)
    :param batch_size: Policy-phase minibatch size; ``None`` gives ``n_steps * n_envs // 8`` (8 minibatches, the paper's)
    :param n_epochs: Policy epochs per iteration (E_pi)
    :param n_value_epochs: Value epochs per iteration (E_V); ``None`` means ``n_epochs``. When equal to ``n_epochs``
        each minibatch minimizes the joint loss with one optimizer; otherwise ``n_value_epochs`` value-only epochs
        (with a separate value optimizer) run first, then ``n_epochs`` policy-only epochs (the reference code's order).
    :param gamma: Discount factor
    :param gae_lambda: Factor for trade-off of bias vs variance for Generalized Advantage Estimator
    :param clip_range: Clipping parameter of the surrogate objective, a constant or a function of the remaining
        progress; ``None`` disables clipping (the paper's KL-penalty variant, with ``kl_coef > 0``)
    :param clip_range_vf: Clipping parameter for the value function (policy phase only; the auxiliary phase's
        value losses are never clipped), ``None`` (default) for no value clipping
    :param normalize_advantage: ``"batch"`` (default: once over the whole rollout, as the paper's code),
        ``"minibatch"`` (per minibatch, as SB3's PPO) or ``"none"``; ``True`` means ``"batch"``, ``False`` ``"none"``
    :param ent_coef: Entropy coefficient for the loss calculation
    :param vf_coef: Value function coefficient of the policy phase (SB3's value loss is a plain MSE, so 0.5 is the
        paper's ``0.5 * MSE``)
    :param max_grad_norm: The maximum value for gradient clipping (both phases); ``None`` (default, the paper's
        choice) disables clipping
    :param kl_coef: Coefficient of the KL penalty ``0.5 * mean((log pi - log pi_behaviour) ** 2)`` added to the
        policy loss (the paper's "ppgkl" uses 1.0 with ``clip_range=None``); 0 disables it
    :param n_policy_iters: Policy iterations (rollouts) per auxiliary phase (N_pi)
    :param n_aux_epochs: Epochs of each auxiliary phase (E_aux); 0 disables the auxiliary phase (PPO)
    :param aux_batch_rollouts: Whole rollouts (of one env, ``n_steps`` steps each) per auxiliary minibatch
        (4 as CleanRL; the paper's 4 workers x 4 rollouts correspond to 16 in one process)
    :param beta_clone: Weight of the behaviour-cloning KL term of the auxiliary phase
    :param vf_true_coef: Weight of the true value function's loss in the auxiliary phase
    :param aux_learning_rate: Learning rate of the auxiliary phase (constant or schedule); ``None`` uses
        ``learning_rate``, evaluated at the same progress point
    :param separate_aux_optimizer: Use a separate, persistent optimizer for the auxiliary phase (True, as the
        paper's code) or share the policy phase's optimizer (False, as CleanRL)
    :param n_aux_grad_accum: Auxiliary minibatches whose gradients are accumulated per optimizer step (a memory
        knob: the effective batch is ``aux_batch_rollouts * n_aux_grad_accum`` rollouts)
    :param use_sde: Whether to use generalized State Dependent Exploration (gSDE) instead of action noise exploration
    :param sde_sample_freq: Sample a new noise matrix every n steps when using gSDE (-1: only at rollout start)
    :param rollout_buffer_class: Rollout buffer class to use. If ``None``, it will be automatically selected.
    :param rollout_buffer_kwargs: Keyword arguments to pass to the rollout buffer on creation.
    :param target_kl: Limit the KL divergence between updates of the policy phase (early stopping); ``None``: no limit
    :param stats_window_size: Window size for the rollout logging, specifying the number of episodes to average
        the reported success rate, mean episode length, and mean reward over
    :param tensorboard_log: the log location for tensorboard (if None, no logging)
    :param policy_kwargs: additional arguments to be passed to the policy on creation (e.g. ``arch``)
    :param verbose: Verbosity level: 0 for no output, 1 for info messages (such as device or wrappers used), 2 for
        debug messages
    :param seed: Seed for the pseudo random generators
    :param device: Device (cpu, cuda, ...) on which the code should be run. The auxiliary buffer always lives in
        CPU memory; its minibatches are moved to the device.
    :param _init_setup_model: Whether or not to build the network at the creation of the instance
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MlpPolicy,
        "CnnPolicy": CnnPolicy,
        "MultiInputPolicy": MultiInputPolicy,
        "ProcgenCnn": ProcgenCnn,
    }
    policy: PPGPolicy
    rollout_buffer: RolloutBuffer

    def __init__(
        self,
        policy: str | type[PPGPolicy],
        env: GymEnv | str,
        learning_rate: float | Schedule = 5e-4,
        n_steps: int = 256,
        batch_size: int | None = None,
        n_epochs: int = 1,
        n_value_epochs: int | None = None,
        gamma: float = 0.999,
        gae_lambda: float = 0.95,
        clip_range: float | Schedule | None = 0.2,
        clip_range_vf: float | Schedule | None = None,
        normalize_advantage: str | bool = "batch",
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
    ):
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
            device=device,
            seed=seed,
            _init_setup_model=False,
            supported_action_spaces=(spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary),
        )
        if normalize_advantage is True:
            normalize_advantage = "batch"
        elif normalize_advantage is False:
            normalize_advantage = "none"
        self.batch_size = batch_size
        self.n_epochs = n_epochs
        self.n_value_epochs = n_epochs if n_value_epochs is None else n_value_epochs
        self.clip_range = clip_range
        self.clip_range_vf = clip_range_vf
        self.normalize_advantage = normalize_advantage
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
        # Cumulative counters: saved with the model
        self._n_aux_phases = 0
        self._n_aux_updates = 0
        # batch_size=None follows n_envs (8 minibatches), also after load() or set_env() with another n_envs
        self._auto_batch_size = batch_size is None
        self._validate_hyperparameters()

        if _init_setup_model:
            self._setup_model()

    def _validate_hyperparameters(self) -> None:
        """Raise a ``ValueError`` naming the problem for any invalid hyperparameter that does not depend on the env."""
        errors = []

        def check(condition: bool, message: str) -> None:
            if not condition:
                errors.append(message)

        check(self.n_steps >= 1, f"n_steps must be >= 1, got {self.n_steps}")
        check(self.batch_size is None or self.batch_size >= 1, f"batch_size must be >= 1 (or None), got {self.batch_size}")
        check(self.n_epochs >= 1, f"n_epochs must be >= 1, got {self.n_epochs}")
        check(self.n_value_epochs >= 0, f"n_value_epochs must be >= 0 (or None), got {self.n_value_epochs}")
        check(0.0 <= self.gamma <= 1.0, f"gamma must be in [0, 1], got {self.gamma}")
        check(0.0 <= self.gae_lambda <= 1.0, f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        check(
            self.normalize_advantage in ADVANTAGE_NORMALIZATIONS,
            f"normalize_advantage must be one of {ADVANTAGE_NORMALIZATIONS} (or a bool), got {self.normalize_advantage!r}",
        )
        for name in ("ent_coef", "vf_coef", "kl_coef", "beta_clone", "vf_true_coef"):
            value = getattr(self, name)
            check(isinstance(value, (int, float)) and value >= 0, f"{name} must be a number >= 0, got {value!r}")
        for name in ("clip_range", "clip_range_vf"):
            value = getattr(self, name)
            if isinstance(value, (int, float)):
                check(value > 0, f"{name} must be > 0, got {value}: pass None to disable clipping")
        check(
            self.max_grad_norm is None or self.max_grad_norm > 0,
            f"max_grad_norm must be > 0, got {self.max_grad_norm}: pass None to disable gradient clipping",
        )
        check(self.target_kl is None or self.target_kl > 0, f"target_kl must be > 0 (or None), got {self.target_kl}")
        check(self.n_aux_epochs >= 0, f"n_aux_epochs must be >= 0 (0 disables the auxiliary phase), got {self.n_aux_epochs}")
        if self.n_aux_epochs > 0:
            check(
                self.n_policy_iters >= 1,
                f"n_policy_iters must be >= 1 when n_aux_epochs > 0, got {self.n_policy_iters} "
                "(set n_aux_epochs=0 for plain PPO)",
            )
            check(self.aux_batch_rollouts >= 1, f"aux_batch_rollouts must be >= 1, got {self.aux_batch_rollouts}")
            check(self.n_aux_grad_accum >= 1, f"n_aux_grad_accum must be >= 1, got {self.n_aux_grad_accum}")
        if errors:
            raise ValueError("Invalid PPG hyperparameters:\n- " + "\n- ".join(errors))

    def _validate_batch_sizes(self, n_envs: int | None = None) -> None:
        """
        Resolve ``batch_size=None`` for ``n_envs`` and raise a ``ValueError`` if a minibatch is larger than what
        it is drawn from.

        :param n_envs: the number of environments to check for (default: the model's)
        """
        n_envs = self.n_envs if n_envs is None else n_envs
        rollout_size = self.n_steps * n_envs
        batch_size = max(1, rollout_size // 8) if self._auto_batch_size else self.batch_size
        if rollout_size < 2:
            raise ValueError(f"n_steps * n_envs must be > 1 (one rollout needs at least 2 samples), got {rollout_size}")
        assert batch_size is not None
        if batch_size > rollout_size:
            raise ValueError(
                f"batch_size={batch_size} is larger than the rollout (n_steps * n_envs = {self.n_steps} * "
                f"{n_envs} = {rollout_size}): use a batch_size <= {rollout_size}."
            )
        if self.normalize_advantage == "minibatch" and batch_size < 2:
            raise ValueError("normalize_advantage='minibatch' needs batch_size > 1 (the std of one sample is undefined).")
        if self.n_aux_epochs > 0:
            n_rollouts = self.n_policy_iters * n_envs
            if self.aux_batch_rollouts > n_rollouts:
                raise ValueError(
                    f"aux_batch_rollouts={self.aux_batch_rollouts} is larger than the auxiliary buffer "
                    f"(n_policy_iters * n_envs = {self.n_policy_iters} * {n_envs} = {n_rollouts} rollouts): "
                    f"use aux_batch_rollouts <= {n_rollouts}."
                )
        if rollout_size % batch_size != 0:
            warnings.warn(
                f"The rollout size (n_steps * n_envs = {rollout_size}) is not a multiple of batch_size={batch_size}: "
                f"the last minibatch of each epoch holds {rollout_size % batch_size} samples."
            )
        self.batch_size = batch_size

    def _setup_model(self) -> None:
        super()._setup_model()
        self.clip_range = FloatSchedule(self.clip_range) if self.clip_range is not None else None  # type: ignore[assignment]
        self.clip_range_vf = FloatSchedule(self.clip_range_vf) if self.clip_range_vf is not None else None  # type: ignore[assignment]
        if self.aux_learning_rate is not None:
            self.aux_learning_rate = FloatSchedule(self.aux_learning_rate)
        self._validate_batch_sizes()
        # The auxiliary buffer is not saved with the model: a loaded model starts a new phase
        self.aux_buffer = self._make_aux_buffer()
        self.aux_optimizer = self._make_optimizer() if self.n_aux_epochs > 0 and self.separate_aux_optimizer else None
        self.value_optimizer = self._make_optimizer() if self.n_value_epochs != self.n_epochs else None

    def _make_aux_buffer(self) -> AuxiliaryBuffer | None:
        """The auxiliary buffer for the current ``n_envs`` (None when the auxiliary phase is off)."""
        if self.n_aux_epochs == 0:
            return None
        return AuxiliaryBuffer(
            self.n_policy_iters, self.n_steps, self.n_envs, self.observation_space, self.action_space, device=self.device
        )

    def _make_optimizer(self) -> th.optim.Optimizer:
        """A new optimizer over all policy parameters, of the policy optimizer's class and settings."""
        return self.policy.optimizer_class(self.policy.parameters(), lr=self.lr_schedule(1), **self.policy.optimizer_kwargs)  # type: ignore[call-arg]

    def _maybe_recommend_cpu(self, mlp_class_name: str = "PPGPolicy") -> None:
        super()._maybe_recommend_cpu(mlp_class_name)

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "aux_buffer", "aux_optimizer", "value_optimizer"]

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
        self._validate_batch_sizes(env.num_envs)
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
        self.aux_buffer = self._make_aux_buffer()

    # ------------------------------------------------------------------------------------------------------------
    # Training: train() is called by SB3's learn() after every rollout
    # ------------------------------------------------------------------------------------------------------------

    def train(self) -> None:
        """
        One PPG iteration on the rollout just collected (the paper's Algorithm 1, inner loop):
        normalize advantages, run the policy phase, store the rollout in the auxiliary buffer and, every
        ``n_policy_iters`` iterations, run the auxiliary phase.
        """
        self.policy.set_training_mode(True)
        if self.normalize_advantage == "batch":
            self._normalize_advantages()
        self._train_policy_phase()
        if self.aux_buffer is not None:
            self.aux_buffer.add(self.rollout_buffer)
            if self.aux_buffer.full():
                self._train_aux_phase()
                self.aux_buffer.reset()
        self.logger.record("train/n_aux_phases", self._n_aux_phases)

    def _normalize_advantages(self) -> None:
        """Normalize the advantages once over the whole rollout (population std + 1e-8, as the paper's code)."""
        advantages = self.rollout_buffer.advantages
        self.rollout_buffer.advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    def _train_policy_phase(self) -> None:
        """
        The policy phase of one iteration: ``n_epochs`` epochs of the PPO objective on the rollout. Joint policy
        and value loss with the policy optimizer when ``n_value_epochs == n_epochs``; otherwise value-only epochs
        with the value optimizer first, then policy-only epochs.
        """
        self._update_learning_rate(self.policy.optimizer)
        stats: dict[str, list[float]] = {}
        if self.value_optimizer is None:
            continue_training, loss = self._run_policy_epochs(
                self.n_epochs, self.policy.optimizer, train_policy=True, train_value=True, stats=stats
            )
        else:
            update_learning_rate(self.value_optimizer, self.lr_schedule(self._current_progress_remaining))
            self._run_policy_epochs(
                self.n_value_epochs, self.value_optimizer, train_policy=False, train_value=True, stats=stats
            )
            continue_training, loss = self._run_policy_epochs(
                self.n_epochs, self.policy.optimizer, train_policy=True, train_value=False, stats=stats
            )

        explained_var = explained_variance(self.rollout_buffer.values.flatten(), self.rollout_buffer.returns.flatten())
        self.logger.record("train/entropy_loss", np.mean(stats["entropy_loss"]))
        self.logger.record("train/policy_gradient_loss", np.mean(stats["policy_gradient_loss"]))
        if stats.get("value_loss"):
            self.logger.record("train/value_loss", np.mean(stats["value_loss"]))
        self.logger.record("train/approx_kl", np.mean(stats["approx_kl"]))
        if self.clip_range is not None:
            self.logger.record("train/clip_fraction", np.mean(stats["clip_fraction"]))
            self.logger.record("train/clip_range", self.clip_range(self._current_progress_remaining))
        if self.kl_coef > 0:
            self.logger.record("train/kl_penalty", np.mean(stats["kl_penalty"]))
        self.logger.record("train/loss", loss)
        self.logger.record("train/explained_variance", explained_var)
        if hasattr(self.policy, "log_std"):
            self.logger.record("train/std", th.exp(self.policy.log_std).mean().item())
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        if self.clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", self.clip_range_vf(self._current_progress_remaining))
        if not continue_training and self.verbose >= 1:
            print(f"Early stopping of the policy phase: approx_kl reached 1.5 * target_kl = {1.5 * self.target_kl:.4f}")

    def _run_policy_epochs(
        self,
        n_epochs: int,
        optimizer: th.optim.Optimizer,
        train_policy: bool,
        train_value: bool,
        stats: dict[str, list[float]],
    ) -> tuple[bool, float]:
        """
        Run ``n_epochs`` epochs of minibatch updates on the rollout buffer.

        :param n_epochs: number of epochs
        :param optimizer: the optimizer that steps
        :param train_policy: include the policy terms (surrogate, entropy, KL penalty)
        :param train_value: include the value term
        :param stats: lists of per-minibatch diagnostics, extended in place (``approx_kl`` keeps the last epoch)
        :return: whether to continue (False after a ``target_kl`` early stop) and the last minibatch's loss
        """
        progress = self._current_progress_remaining
        clip_range = self.clip_range(progress) if self.clip_range is not None else None
        clip_range_vf = self.clip_range_vf(progress) if self.clip_range_vf is not None else None
        optimizer.zero_grad(set_to_none=True)
        loss_value = float("nan")
        continue_training = True
        for _ in range(n_epochs):
            if train_policy:
                stats["approx_kl"] = []
            for rollout_data in self.rollout_buffer.get(self.batch_size):
                if train_policy:
                    actions = rollout_data.actions
                    if isinstance(self.action_space, spaces.Discrete):
                        actions = actions.long().flatten()
                    values, log_prob, entropy = self.policy.evaluate_actions(rollout_data.observations, actions)
                else:
                    values = self.policy.predict_values(rollout_data.observations)
                values = values.flatten()
                loss = th.zeros((), device=self.device)

                if train_policy:
                    advantages = rollout_data.advantages
                    if self.normalize_advantage == "minibatch" and len(advantages) > 1:
                        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
                    log_ratio = log_prob - rollout_data.old_log_prob
                    ratio = th.exp(log_ratio)
                    if clip_range is None:
                        policy_loss = -(advantages * ratio).mean()
                    else:
                        clipped_ratio = th.clamp(ratio, 1 - clip_range, 1 + clip_range)
                        policy_loss = -th.min(advantages * ratio, advantages * clipped_ratio).mean()
                        stats.setdefault("clip_fraction", []).append(th.mean((th.abs(ratio - 1) > clip_range).float()).item())
                    entropy_loss = -th.mean(-log_prob) if entropy is None else -th.mean(entropy)
                    loss = policy_loss + self.ent_coef * entropy_loss
                    if self.kl_coef > 0:
                        kl_penalty = 0.5 * th.mean(log_ratio**2)
                        loss = loss + self.kl_coef * kl_penalty
                        stats.setdefault("kl_penalty", []).append(kl_penalty.item())
                    stats.setdefault("policy_gradient_loss", []).append(policy_loss.item())
                    stats.setdefault("entropy_loss", []).append(entropy_loss.item())
                    with th.no_grad():
                        approx_kl = th.mean((ratio - 1) - log_ratio).item()
                    stats["approx_kl"].append(approx_kl)
                    if self.target_kl is not None and approx_kl > 1.5 * self.target_kl:
                        # Stop before the step, as SB3's PPO does
                        continue_training = False
                        break

                if train_value:
                    values_pred = values
                    if clip_range_vf is not None:
                        values_pred = rollout_data.old_values + th.clamp(
                            values - rollout_data.old_values, -clip_range_vf, clip_range_vf
                        )
                    value_loss = F.mse_loss(rollout_data.returns, values_pred)
                    loss = loss + self.vf_coef * value_loss
                    stats.setdefault("value_loss", []).append(value_loss.item())

                self._check_finite(loss, "policy")
                loss.backward()
                self._clip_gradients()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                loss_value = loss.item()
            self._n_updates += 1
            if not continue_training:
                break
        return continue_training, loss_value

    def _train_aux_phase(self) -> None:
        """
        The auxiliary phase: store the current policy's distribution on every buffered state (pi_old), then
        ``n_aux_epochs`` epochs over minibatches of whole rollouts minimizing
        ``beta_clone * KL(pi_old || pi) + 0.5 * MSE(aux_value, target) + vf_true_coef * 0.5 * MSE(value, target)``.
        """
        assert self.aux_buffer is not None
        start_time = time.perf_counter()
        optimizer = self.aux_optimizer if self.aux_optimizer is not None else self.policy.optimizer
        learning_rate = (self.aux_learning_rate or self.lr_schedule)(self._current_progress_remaining)  # type: ignore[operator]
        update_learning_rate(optimizer, learning_rate)
        self.aux_buffer.compute_old_distributions(self.policy, self.aux_batch_rollouts)

        n_batches = -(-self.aux_buffer.n_rollouts // self.aux_batch_rollouts)
        accum = self.n_aux_grad_accum
        kl_losses, aux_value_losses, real_value_losses = [], [], []
        # No gradient of the policy phase may leak into the first step
        optimizer.zero_grad(set_to_none=True)
        for _ in range(self.n_aux_epochs):
            for batch_index, batch in enumerate(self.aux_buffer.get(self.aux_batch_rollouts)):
                distribution, values, aux_values = self.policy.forward_aux(batch.observations)
                kl_loss = kl_divergence_from_params(batch.old_distribution_params, distribution).mean()
                aux_value_loss = 0.5 * F.mse_loss(aux_values.flatten(), batch.returns)
                real_value_loss = 0.5 * F.mse_loss(values.flatten(), batch.returns)
                loss = self.beta_clone * kl_loss + aux_value_loss + self.vf_true_coef * real_value_loss
                self._check_finite(loss, "auxiliary")
                # Average the gradient over the minibatches of one accumulation group (the last may be shorter)
                group_start = batch_index - batch_index % accum
                group_size = min(accum, n_batches - group_start)
                (loss / group_size).backward()
                if batch_index - group_start == group_size - 1:
                    self._clip_gradients()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    self._n_aux_updates += 1
                kl_losses.append(kl_loss.item())
                aux_value_losses.append(aux_value_loss.item())
                real_value_losses.append(real_value_loss.item())
        self._n_aux_phases += 1

        self.logger.record("aux/kl_loss", np.mean(kl_losses))
        self.logger.record("aux/aux_value_loss", np.mean(aux_value_losses))
        self.logger.record("aux/real_value_loss", np.mean(real_value_losses))
        self.logger.record("aux/learning_rate", learning_rate)
        self.logger.record("aux/n_updates", self._n_aux_updates, exclude="tensorboard")
        self.logger.record("time/aux_phase_s", time.perf_counter() - start_time)

    def _clip_gradients(self) -> None:
        """Clip the global gradient norm to ``max_grad_norm`` (no-op when it is None)."""
        if self.max_grad_norm is not None:
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)

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

    def learn(
        self: SelfPPG,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "PPG",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfPPG:
        return super().learn(
            total_timesteps=total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=tb_log_name,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )

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

    # ------------------------------------------------------------------------------------------------------------
    # The auxiliary buffer on disk (like SB3's save_replay_buffer / load_replay_buffer)
    # ------------------------------------------------------------------------------------------------------------

    def save_aux_buffer(self, path: str | pathlib.Path | io.BufferedIOBase) -> None:
        """
        Save the auxiliary buffer (as a pickle file), so that a run can resume mid-phase without losing data.
        It is not part of the model zip because it can be many GB.

        :param path: Path to the file where the buffer should be saved; ".pkl" is appended to a str path without it
        """
        if self.aux_buffer is None:
            raise ValueError("This model has no auxiliary buffer (n_aux_epochs=0): there is nothing to save.")
        save_to_pkl(path, self.aux_buffer, self.verbose)

    def load_aux_buffer(self, path: str | pathlib.Path | io.BufferedIOBase) -> None:
        """
        Load an auxiliary buffer saved by ``save_aux_buffer``; the rollouts it holds count toward the next
        auxiliary phase.

        :param path: Path to the pickled buffer
        """
        if self.aux_buffer is None:
            raise ValueError("This model has no auxiliary buffer (n_aux_epochs=0): it cannot load one.")
        try:
            buffer = load_from_pkl(path, self.verbose)
        except FileNotFoundError:
            raise
        except Exception as error:
            raise ValueError(
                f"Could not read an auxiliary buffer from {path!r} (corrupt or not a pickle file): {error}"
            ) from error
        if not isinstance(buffer, AuxiliaryBuffer):
            raise ValueError(f"{path!r} does not hold a PPG AuxiliaryBuffer but a {type(buffer).__name__}.")
        expected = (self.n_policy_iters, self.n_steps, self.n_envs, self.observation_space, self.action_space)
        found = (buffer.n_policy_iters, buffer.n_steps, buffer.n_envs, buffer.observation_space, buffer.action_space)
        if found != expected:
            names = ("n_policy_iters", "n_steps", "n_envs", "observation_space", "action_space")
            mismatches = [
                f"{name}: buffer {f} != model {e}" for name, f, e in zip(names, found, expected, strict=True) if f != e
            ]
            raise ValueError(f"The auxiliary buffer in {path!r} does not fit this model ({'; '.join(mismatches)}).")
        buffer.device = self.device
        self.aux_buffer = buffer
