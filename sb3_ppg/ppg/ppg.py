"""Phasic Policy Gradient (Cobbe et al., 2021) as a Stable-Baselines3 on-policy algorithm."""

import time
from collections import defaultdict
from typing import Any, ClassVar

import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, RolloutBufferSamples, Schedule
from stable_baselines3.common.utils import (
    FloatSchedule,
    update_learning_rate,
)
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.common.vec_env.patch_gym import _patch_env

from sb3_ppg.common import distributed
from sb3_ppg.common.buffers import AuxiliaryBufferSamples, split_observations
from sb3_ppg.common.distributions import get_distribution_params
from sb3_ppg.common.hyperparameters import (
    PRECISIONS,
    check_hyperparameters,
    has_convolutions,
    resolve_batch_size,
    resolve_micro_batch_size,
    resolve_normalize_advantage,
    resolve_precision,
)
from sb3_ppg.ppg import losses
from sb3_ppg.ppg.base import PPGBase, SavedPolicyClass
from sb3_ppg.ppg.policies import (
    CnnPolicy,
    MlpPolicy,
    MultiInputPolicy,
    PPGPolicy,
    ProcgenCnn,
    check_action_space,
    check_observation_space,
)


class PPG(PPGBase):
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
    :param micro_batch_size: The most samples that one forward and backward pass holds. Larger minibatches of
        either phase run as micro-batches whose gradients add up before the optimizer step: the same update up to
        float rounding, with the activations of one micro-batch at a time (the old-policy pass runs in parts of
        this size too). ``"auto"`` (default): 256 for a convolutional features extractor on a CPU (measured faster
        there, and the activations live in host memory), whole minibatches elsewhere (MLP extractors, GPUs).
        ``None``: whole minibatches.
    :param precision: ``"auto"`` (default): bfloat16 autocast in the policy and auxiliary phases (float32 rollouts)
        for a convolutional features extractor on a CPU with AMX, where it was measured 2.1x faster end to end with
        the same learning curves; float32 otherwise (MLP extractors, GPUs: not measured yet). ``"fp32"`` or
        ``"bf16"``: every phase; with ``"bf16"`` the features extractors run under bfloat16 autocast (the heads,
        distributions, losses and optimizer stay in float32). Or a dict choosing per phase, e.g.
        ``{"rollout": "bf16", "policy": "fp32", "aux": "bf16"}`` (missing phases are ``"fp32"``).
        ``phase_precision`` tells what a model uses.
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
        "ProcgenCnnPolicy": ProcgenCnn,
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
            device=distributed.auto_init(device),
            seed=seed,
            _init_setup_model=False,
            supported_action_spaces=(spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary),
        )
        self.batch_size = batch_size
        self.n_epochs = n_epochs
        self.n_value_epochs = n_epochs if n_value_epochs is None else n_value_epochs
        self.clip_range = clip_range
        self.clip_range_vf = clip_range_vf
        self.normalize_advantage = resolve_normalize_advantage(normalize_advantage)
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
        self.micro_batch_size = micro_batch_size
        self.precision = precision
        # Cumulative counters: saved with the model
        self._n_aux_phases = 0
        self._n_aux_updates = 0
        # batch_size=None follows n_envs (8 minibatches), also after load() or set_env() with another n_envs
        self._auto_batch_size = batch_size is None
        check_hyperparameters(self)

        if _init_setup_model:
            self._setup_model()

    @staticmethod
    def _wrap_env(env: GymEnv, verbose: int = 0, monitor_wrapper: bool = True) -> VecEnv:
        """
        SB3's wrapping of the env (``Monitor``, ``DummyVecEnv``, ``VecTransposeImage``), after checking its spaces:
        an observation or action space that PPG does not support is a ``ValueError`` naming it and the fix, before
        SB3 fails on it (a Graph, Sequence or Text space) or runs with it silently wrong (a Discrete action space
        whose ``start`` is not 0). Called by the constructor, ``set_env()`` and ``load()``.

        :param env: the env
        :param verbose: Verbosity level: 1 prints the wrappers used
        :param monitor_wrapper: Whether to wrap a gymnasium env in a ``Monitor``
        :return: the wrapped env
        """
        if not isinstance(env, VecEnv):
            env = _patch_env(env)  # a gym (not gymnasium) env, converted as SB3 does, has gymnasium spaces
        check_observation_space(env.observation_space)
        check_action_space(env.action_space)
        return PPGBase._wrap_env(env, verbose, monitor_wrapper)

    def _setup_model(self) -> None:
        # PPG.load() sets the saved hyperparameters (and those given to load()) before this call: check them as the
        # constructor does, before anything is built from them
        if isinstance(self.policy_class, SavedPolicyClass):
            self.policy_class = self.policy_class.policy_class
        self.normalize_advantage = resolve_normalize_advantage(self.normalize_advantage)
        check_hyperparameters(self)
        super()._setup_model()
        self.clip_range = FloatSchedule(self.clip_range) if self.clip_range is not None else None  # type: ignore[assignment]
        self.clip_range_vf = FloatSchedule(self.clip_range_vf) if self.clip_range_vf is not None else None  # type: ignore[assignment]
        if self.aux_learning_rate is not None:
            self.aux_learning_rate = FloatSchedule(self.aux_learning_rate)
        self.batch_size = resolve_batch_size(self, self.n_envs)
        # The features extractors' precision in each phase; between train() calls (rollouts, predict) the rollouts'
        self._phase_dtypes = resolve_precision(self.precision, self.device, has_convolutions(self.policy))
        self.policy.compute_dtype = self._phase_dtypes["rollout"]
        self._micro_batch_size = resolve_micro_batch_size(self.micro_batch_size, self.device, has_convolutions(self.policy))
        # The auxiliary buffer is not saved with the model: a loaded model starts a new phase
        self.aux_buffer = self._make_aux_buffer()
        # The auxiliary phase's own Adam (the paper's code), unless it shares the policy phase's (CleanRL)
        self.aux_optimizer = self._make_optimizer() if self.n_aux_epochs > 0 and self.separate_aux_optimizer else None
        # Separate value epochs (E_V != E_pi) step a second Adam of their own, as the paper's code does
        self.value_optimizer = self._make_optimizer() if self.n_value_epochs != self.n_epochs else None

    @property
    def phase_precision(self) -> dict[str, str]:
        """The features extractors' precision in each phase (``"fp32"`` or ``"bf16"``), with ``"auto"`` resolved."""
        names = {dtype: name for name, dtype in PRECISIONS.items()}
        return {phase: names[dtype] for phase, dtype in self._phase_dtypes.items()}

    # ------------------------------------------------------------------------------------------------------------
    # Training: SB3's learn() collects a rollout, then calls train()
    # ------------------------------------------------------------------------------------------------------------

    def train(self) -> None:
        """
        One PPG iteration on the rollout just collected (the paper's Algorithm 1, inner loop): normalize the
        advantages, run the policy phase, store the rollout in the auxiliary buffer and, every ``n_policy_iters``
        iterations, compute the old policy on the buffer and run the auxiliary phase.
        """
        self.policy.set_training_mode(True)
        if self.normalize_advantage == "batch":
            advantages = self.rollout_buffer.advantages
            if distributed.is_active():  # over all ranks' samples
                mean, std = distributed.global_mean_std(advantages)
            else:
                mean, std = advantages.mean(), advantages.std()
            self.rollout_buffer.advantages = (advantages - mean) / (std + 1e-8)
        self.policy.compute_dtype = self._phase_dtypes["policy"]
        try:
            self._train_policy_phase()
        finally:
            # The next rollout (and predict) runs at the rollout precision, whether or not an aux phase follows
            self.policy.compute_dtype = self._phase_dtypes["rollout"]
        if self.aux_buffer is not None:
            self._finish_interrupted_aux_phase()
            self.aux_buffer.add(self.rollout_buffer)
            if self.aux_buffer.full():
                self._run_aux_phase()
        self.logger.record("train/n_aux_phases", self._n_aux_phases)
        self._at_rollout_boundary = True

    def _train_policy_phase(self) -> None:
        """
        The policy phase: PPO on the rollout. When ``n_value_epochs == n_epochs`` (the default) each minibatch
        minimizes the joint loss with the policy optimizer. Otherwise ``n_value_epochs`` value-only epochs with the
        value optimizer run first, then ``n_epochs`` policy-only epochs (the order of the paper's code).
        """
        progress = self._current_progress_remaining
        self._update_learning_rate(self.policy.optimizer)
        clip_range = self._schedule_value("clip_range", progress)
        clip_range_vf = self._schedule_value("clip_range_vf", progress)
        stats: dict[str, list[th.Tensor]] = defaultdict(list)
        continue_training, loss = True, th.full((), float("nan"))

        def joint_loss(data: RolloutBufferSamples) -> tuple[th.Tensor, losses.Diagnostics]:
            values, log_prob, entropy = self.policy.evaluate_actions(data.observations, self._actions(data))
            policy_loss, diagnostics = self._policy_loss(data, log_prob, entropy, clip_range)
            value_loss, value_diagnostics = self._value_loss(data, values, clip_range_vf)
            return policy_loss + self.vf_coef * value_loss, {**diagnostics, **value_diagnostics}

        def policy_only_loss(data: RolloutBufferSamples) -> tuple[th.Tensor, losses.Diagnostics]:
            _, log_prob, entropy = self.policy.evaluate_actions(data.observations, self._actions(data))
            return self._policy_loss(data, log_prob, entropy, clip_range)

        def value_only_loss(data: RolloutBufferSamples) -> tuple[th.Tensor, losses.Diagnostics]:
            value_loss, diagnostics = self._value_loss(data, self.policy.predict_values(data.observations), clip_range_vf)
            return self.vf_coef * value_loss, diagnostics

        if self.value_optimizer is not None:
            update_learning_rate(self.value_optimizer, self.lr_schedule(progress))
            for _ in range(self.n_value_epochs):
                for rollout_data in self.rollout_buffer.get(self.batch_size):
                    _, diagnostics = self._backward(rollout_data, value_only_loss, "policy")
                    losses.append_diagnostics(stats, diagnostics)
                    self._step(self.value_optimizer, "policy")
                self._n_updates += 1
        compute_loss = joint_loss if self.value_optimizer is None else policy_only_loss
        for _ in range(self.n_epochs):
            stats["approx_kl"] = []
            for rollout_data in self.rollout_buffer.get(self.batch_size):
                rollout_data = self._normalize_minibatch_advantages(rollout_data)
                minibatch_loss, diagnostics = self._backward(rollout_data, compute_loss, "policy")
                # The value loss of a minibatch that early stopping discards is not logged
                value_loss = diagnostics.pop("value_loss", None)
                losses.append_diagnostics(stats, diagnostics)
                if not (continue_training := self._below_target_kl(stats)):
                    self.policy.optimizer.zero_grad(set_to_none=True)
                    break
                if value_loss is not None:
                    stats["value_loss"].append(value_loss)
                loss = minibatch_loss
                self._step(self.policy.optimizer, "policy")
            self._n_updates += 1
            if not continue_training:
                break

        self._log_policy_phase(stats, loss, clip_range, clip_range_vf, continue_training)

    def _actions(self, rollout_data: RolloutBufferSamples) -> th.Tensor:
        """The minibatch's actions in the form the distribution's ``log_prob`` expects."""
        if isinstance(self.action_space, spaces.Discrete):
            return rollout_data.actions.long().flatten()
        return rollout_data.actions

    def _normalize_minibatch_advantages(self, rollout_data: RolloutBufferSamples) -> RolloutBufferSamples:
        """The minibatch with its advantages normalized over it when ``normalize_advantage="minibatch"`` (SB3's PPO)."""
        if self.normalize_advantage != "minibatch":
            return rollout_data
        return rollout_data._replace(advantages=losses.normalize_advantages(rollout_data.advantages))

    def _policy_loss(
        self,
        rollout_data: RolloutBufferSamples,
        log_prob: th.Tensor,
        entropy: th.Tensor | None,
        clip_range: float | None,
    ) -> tuple[th.Tensor, losses.Diagnostics]:
        """The policy loss of a minibatch and its diagnostics (see :func:`sb3_ppg.ppg.losses.policy_loss`)."""
        return losses.policy_loss(
            rollout_data.advantages,
            log_prob,
            rollout_data.old_log_prob,
            entropy,
            clip_range,
            self.ent_coef,
            self.kl_coef,
        )

    def _below_target_kl(self, stats: dict[str, list[th.Tensor]]) -> bool:
        """
        Whether the last minibatch's approx KL allows its update (SB3's PPO: stop before 1.5 * target_kl). In
        data-parallel training it is the ranks' mean, so that every rank decides the same.
        """
        if self.target_kl is None:
            return True
        if distributed.is_active():
            stats["approx_kl"][-1] = distributed.all_reduce_mean(stats["approx_kl"][-1])
        return stats["approx_kl"][-1].item() <= 1.5 * self.target_kl

    def _value_loss(
        self, rollout_data: RolloutBufferSamples, values: th.Tensor, clip_range_vf: float | None
    ) -> tuple[th.Tensor, losses.Diagnostics]:
        """The value loss of a minibatch and its diagnostics (see :func:`sb3_ppg.ppg.losses.value_loss`)."""
        return losses.value_loss(values.flatten(), rollout_data.returns, rollout_data.old_values, clip_range_vf)

    def _compute_old_distributions(self) -> None:
        """
        Store the current policy's action distribution on every buffered state: the ``pi_old`` that the auxiliary
        phase's behaviour-cloning term keeps the policy close to. One pass without gradients, in chunks.
        """
        assert self.aux_buffer is not None
        with th.inference_mode():
            for rows, observations in self.aux_buffer.iter_rollout_chunks(self.aux_batch_rollouts):
                parts = split_observations(observations, self._micro_batch_size)
                params = [get_distribution_params(self.policy.get_distribution(part)) for part in parts]
                self.aux_buffer.store_old_distribution_params(rows, params[0] if len(params) == 1 else th.cat(params))

    def _train_aux_phase(self) -> None:
        """
        The auxiliary phase: ``n_aux_epochs`` epochs over shuffled minibatches of whole rollouts, minimizing
        ``_aux_loss``, with ``n_aux_grad_accum`` minibatches per optimizer step.
        """
        assert self.aux_buffer is not None
        start_time = time.perf_counter()
        optimizer = self.aux_optimizer if self.aux_optimizer is not None else self.policy.optimizer
        learning_rate = self._schedule_value("aux_learning_rate", self._current_progress_remaining)
        update_learning_rate(optimizer, learning_rate)
        n_batches = -(-self.aux_buffer.n_rollouts // self.aux_batch_rollouts)
        accum = self.n_aux_grad_accum
        stats: dict[str, list[th.Tensor]] = defaultdict(list)
        # No gradient of the policy phase may leak into the first step
        optimizer.zero_grad(set_to_none=True)
        for _ in range(self.n_aux_epochs):
            for batch_index, batch in enumerate(self.aux_buffer.get(self.aux_batch_rollouts)):
                # Average the gradient over the minibatches of one accumulation group (the last may be shorter)
                group_start = batch_index - batch_index % accum
                group_size = min(accum, n_batches - group_start)
                _, diagnostics = self._backward(batch, self._aux_loss, "auxiliary", divisor=group_size)
                losses.append_diagnostics(stats, diagnostics)
                if batch_index - group_start == group_size - 1:
                    self._step(optimizer, "auxiliary")
                    self._n_aux_updates += 1
        self._n_aux_phases += 1

        for name in ("kl_loss", "aux_value_loss", "real_value_loss"):
            self.logger.record(f"aux/{name}", th.stack(stats[name]).mean().item())
        self.logger.record("aux/learning_rate", learning_rate)
        self.logger.record("aux/n_updates", self._n_aux_updates, exclude="tensorboard")
        self.logger.record("time/aux_phase_s", time.perf_counter() - start_time)

    def _aux_loss(self, batch: AuxiliaryBufferSamples) -> tuple[th.Tensor, losses.Diagnostics]:
        """The auxiliary loss of a minibatch and its diagnostics, one forward pass (:func:`~sb3_ppg.ppg.losses.aux_loss`)."""
        distribution, values, aux_values = self.policy.forward_aux(batch.observations)
        return losses.aux_loss(
            distribution, batch.old_distribution_params, values, aux_values, batch.returns, self.beta_clone, self.vf_true_coef
        )
