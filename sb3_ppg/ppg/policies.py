"""PPG policies: an actor-critic with an auxiliary value head, in the paper's three architectures."""

import warnings
from contextlib import AbstractContextManager
from functools import partial
from typing import Any, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.distributions import Distribution
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.torch_layers import (
    BaseFeaturesExtractor,
    CombinedExtractor,
    FlattenExtractor,
    NatureCNN,
)
from stable_baselines3.common.type_aliases import PyTorchObs, Schedule
from stable_baselines3.common.utils import get_device
from torch import nn

from sb3_ppg.common.cuda.cuda_graphs import GraphedForward, parameter_addresses
from sb3_ppg.common.cuda.cuda_streams import SideStream
from sb3_ppg.common.distributions import make_distribution, sampling_checks_parameters, unchecked_distributions
from sb3_ppg.common.hyperparameters import is_integer
from sb3_ppg.common.precision import PRECISION_NAMES, PRECISIONS
from sb3_ppg.common.preprocessing import (
    add_scalar_feature_axis,
    check_action_space,
    check_finite_observations,
    check_observation_keys,
    check_observation_space,
    preprocess_obs_as,
)
from sb3_ppg.common.torch_layers import HEAD_SCALE, IMPALA_DENSE_SCALE, ImpalaCNN, normed_init_

ARCHS = ("dual", "detach", "shared")
NET_ARCH_KEYS = ("pi", "vf")


def check_net_arch(net_arch: object) -> list[int] | dict[str, list[int]] | None:
    """
    Check a policy's ``net_arch``: a list of layer sizes or a dict with ``"pi"`` and ``"vf"`` (SB3's old
    ``[dict(pi=..., vf=...)]`` with SB3's warning; shared layers next to it are an error).

    :param net_arch: the ``net_arch`` given to the policy (None: the policy's default)
    :return: the same architecture, its sizes as Python ints
    """
    if net_arch is None:
        return None
    if isinstance(net_arch, (list, tuple)) and any(isinstance(entry, dict) for entry in net_arch):
        if len(net_arch) > 1:
            raise ValueError(
                f"net_arch={net_arch!r} mixes layer sizes and a dict (SB3's format before v1.8.0, whose shared layers "
                "SB3 removed): the other entries would be dropped. Pass a dict of separate networks, e.g. "
                "net_arch=dict(pi=[64, 64], vf=[64, 64]), or a list of layer sizes with policy_kwargs=dict("
                "arch='shared') (or 'detach') for one network shared by the policy and the value function."
            )
        warnings.warn(
            "As shared layers in the mlp_extractor are removed since SB3 v1.8.0, you should now pass directly a "
            "dictionary and not a list (net_arch=dict(pi=..., vf=...) instead of net_arch=[dict(pi=..., vf=...)])"
        )
        net_arch = net_arch[0]
    if isinstance(net_arch, dict):
        unknown = [key for key in net_arch if key not in NET_ARCH_KEYS]
        if unknown:
            raise ValueError(
                f"net_arch has unknown keys {unknown}: the valid keys are 'pi' (the policy network) and 'vf' (the value "
                "network), e.g. net_arch=dict(pi=[64, 64], vf=[64, 64])."
            )
        return {key: _layer_sizes(layers, f"net_arch[{key!r}]") for key, layers in net_arch.items()}
    return _layer_sizes(net_arch, "net_arch")


def _layer_sizes(layers: object, where: str) -> list[int]:
    """The hidden-layer sizes of one network, checked (a list or tuple of positive integers)."""
    if not isinstance(layers, (list, tuple)):
        raise ValueError(
            f"{where} must be a list of layer sizes (positive ints, e.g. [64, 64]) or, for net_arch, a dict "
            f"dict(pi=[...], vf=[...]); got {layers!r} ({type(layers).__name__})."
        )
    invalid = [size for size in layers if not (is_integer(size) and size >= 1)]
    if invalid:
        raise ValueError(f"{where}={layers!r} holds invalid layer sizes {invalid!r}: each must be a positive int.")
    return [int(size) for size in layers]


SelfPPGPolicy = TypeVar("SelfPPGPolicy", bound="PPGPolicy")


class PPGPolicy(ActorCriticPolicy):
    """
    Actor-critic policy for PPG: SB3's ``ActorCriticPolicy`` plus an auxiliary value head on the policy network, in one
    of the paper's three architectures (``arch``: ``"dual"``, ``"detach"``, ``"shared"``; see docs/ppg.md).

    :param observation_space: Observation space
    :param action_space: Action space
    :param lr_schedule: Learning rate schedule (could be constant)
    :param net_arch: The specification of the policy and value networks (one-network ``arch``: the policy network's)
    :param activation_fn: Activation function
    :param ortho_init: Whether to use SB3's orthogonal initialization (mutually exclusive with ``normed_init``)
    :param use_sde: Whether to use State Dependent Exploration or not
    :param log_std_init: Initial value for the log standard deviation
    :param full_std: Whether to use (n_features x n_actions) parameters for the std instead of only (n_features,)
    :param use_expln: Use ``expln()`` function instead of ``exp()`` to ensure a positive standard deviation (cf paper)
    :param squash_output: Whether to squash the output using a tanh function (only with gSDE)
    :param features_extractor_class: Features extractor to use; ``None``: ``default_features_extractor_class``
    :param features_extractor_kwargs: Keyword arguments to pass to the features extractor.
    :param share_features_extractor: ``None``: from ``arch``; without ``arch``, ``True`` is ``"shared"``, ``False`` ``"dual"``
    :param normalize_images: Whether to normalize images or not, dividing by 255.0 (True by default)
    :param optimizer_class: The optimizer to use, ``th.optim.Adam`` by default
    :param optimizer_kwargs: Additional keyword arguments, excluding the learning rate, to pass to the optimizer
    :param arch: ``"dual"``, ``"detach"`` or ``"shared"``; ``None``: ``"dual"`` (``"shared"`` with a shared extractor)
    :param detach_value_in_aux: With ``arch="detach"``, keep the value head detached in the auxiliary phase too
    :param normed_init: Use the paper's normalized initialization for the heads and hidden MLP layers
    """

    default_features_extractor_class: type[BaseFeaturesExtractor] = FlattenExtractor
    #: The algorithm whose models hold this policy (``sb3_ppg.<name>``): named by the errors of loading a model zip
    #: with another algorithm, and checked by ``PPG.load``
    algorithm_name: str = "PPG"

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        net_arch: list[int] | dict[str, list[int]] | None = None,
        activation_fn: type[nn.Module] = nn.Tanh,
        ortho_init: bool = True,
        use_sde: bool = False,
        log_std_init: float = 0.0,
        full_std: bool = True,
        use_expln: bool = False,
        squash_output: bool = False,
        features_extractor_class: type[BaseFeaturesExtractor] | None = None,
        features_extractor_kwargs: dict[str, Any] | None = None,
        share_features_extractor: bool | None = None,
        normalize_images: bool = True,
        optimizer_class: type[th.optim.Optimizer] = th.optim.Adam,
        optimizer_kwargs: dict[str, Any] | None = None,
        arch: str | None = None,
        detach_value_in_aux: bool = True,
        normed_init: bool = False,
    ):
        check_observation_space(observation_space)
        check_action_space(action_space)
        if features_extractor_class is None:
            features_extractor_class = self.default_features_extractor_class
        arch = self._resolve_arch(arch, share_features_extractor)
        expected_share = arch != "dual"
        if ortho_init and normed_init:
            raise ValueError("ortho_init and normed_init are mutually exclusive: set ortho_init=False to use normed_init.")
        if optimizer_kwargs is None and optimizer_class == th.optim.Adam:
            optimizer_kwargs = {"eps": 1e-8}
        # Set before the parent constructor, which calls _build()
        # The precision of the features extractors: float32, or bfloat16 autocast (set by PPG for each phase)
        self.compute_dtype = th.float32
        # Replay the rollout's forward pass from CUDA graphs on a CUDA device (set by PPG's cuda_graphs)
        self.rollout_cuda_graphs = False
        self._rollout_graphs: GraphedForward | None = None
        # Run arch="dual"'s value network on a second CUDA stream beside the policy network (set by PPG's
        # parallel_networks)
        self.parallel_networks = False
        self._value_stream: SideStream | None = None
        self.arch = arch
        self.detach_value_in_aux = detach_value_in_aux
        self.normed_init = normed_init
        net_arch = self._resolve_net_arch(check_net_arch(net_arch), arch, features_extractor_class)
        super().__init__(
            observation_space,
            action_space,
            lr_schedule,
            net_arch=net_arch,
            activation_fn=activation_fn,
            ortho_init=ortho_init,
            use_sde=use_sde,
            log_std_init=log_std_init,
            full_std=full_std,
            use_expln=use_expln,
            squash_output=squash_output,
            features_extractor_class=features_extractor_class,
            features_extractor_kwargs=features_extractor_kwargs,
            share_features_extractor=expected_share,
            normalize_images=normalize_images,
            optimizer_class=optimizer_class,
            optimizer_kwargs=optimizer_kwargs,
        )

    @staticmethod
    def _resolve_arch(arch: str | None, share_features_extractor: bool | None) -> str:
        """The PPG architecture from ``arch`` and SB3's ``share_features_extractor`` (see the class docstring)."""
        if arch is None:
            return "shared" if share_features_extractor else "dual"
        if arch not in ARCHS:
            raise ValueError(f"Unknown PPG arch {arch!r}: choose one of {', '.join(repr(a) for a in ARCHS)}.")
        if share_features_extractor is not None and share_features_extractor != (arch != "dual"):
            raise ValueError(
                f"share_features_extractor={share_features_extractor} contradicts arch={arch!r}: arch='dual' has "
                "separate networks, arch='detach' / arch='shared' one network. Pass only one of the two."
            )
        return arch

    @staticmethod
    def _resolve_net_arch(
        net_arch: list[int] | dict[str, list[int]] | None,
        arch: str,
        features_extractor_class: type[BaseFeaturesExtractor],
    ) -> list[int] | dict[str, list[int]]:
        """The ``net_arch`` for SB3's ``MlpExtractor``: the default, and the policy network alone for one-network ``arch``."""
        if net_arch is None:
            cnn_extractors = (NatureCNN, ImpalaCNN)
            net_arch = [] if issubclass(features_extractor_class, cnn_extractors) else [64, 64]
        if arch == "dual":
            return net_arch
        if isinstance(net_arch, dict):
            if net_arch.get("vf"):
                raise ValueError(
                    f"arch={arch!r} has a single network: the value head sits on the policy latent, so "
                    f"net_arch['vf']={net_arch['vf']} would be unused. Pass net_arch as a list (the policy network) "
                    "or use arch='dual' (share_features_extractor=False) for a separate value network."
                )
            policy_layers = list(net_arch.get("pi", []))
        else:
            policy_layers = list(net_arch)
        return dict(pi=policy_layers, vf=[])

    def _build(self, lr_schedule: Schedule) -> None:
        """
        Create the networks (the value head on the policy latent for one-network ``arch``, the auxiliary value head),
        initialize them and create the optimizer.
        """
        self.action_dist = self._make_action_dist()
        super()._build(lr_schedule)
        latent_dim_pi = self.mlp_extractor.latent_dim_pi
        if self.arch != "dual":
            # One network: the value head reads the policy latent
            self.value_net = nn.Linear(latent_dim_pi, 1)
            if self.ortho_init:
                self.value_net.apply(partial(self.init_weights, gain=1))
        self.aux_value_net = nn.Linear(latent_dim_pi, 1)
        if self.ortho_init:
            self.aux_value_net.apply(partial(self.init_weights, gain=1))
        if self.normed_init:
            for module in self.mlp_extractor.modules():
                if isinstance(module, nn.Linear):
                    normed_init_(module, IMPALA_DENSE_SCALE)
            for head in (self.action_net, self.value_net, self.aux_value_net):
                normed_init_(head, HEAD_SCALE)
        # The parent built its optimizer before the heads above existed
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)  # type: ignore[call-arg]

    def _make_action_dist(self) -> Distribution:
        """
        The action distribution ``_build`` makes the action network for: SB3's, whose argument checks the rollout and
        ``train()`` can skip (``unchecked_distributions``); a subclass's hook (``MaskablePPGPolicy``).
        """
        return make_distribution(self.action_space, self.use_sde, self.dist_kwargs)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(
            dict(
                # SB3 omits it; without it a dual policy loaded with Policy.load() would be rebuilt shared
                share_features_extractor=self.share_features_extractor,
                arch=self.arch,
                detach_value_in_aux=self.detach_value_in_aux,
                normed_init=self.normed_init,
            )
        )
        return data

    def save(self, path: str) -> None:
        """
        Save the policy alone (SB3's file), with the precision its forward passes run at outside ``train()``
        (``compute_dtype``: the model's rollout precision), which :meth:`load` sets again.

        :param path: The file to write
        """
        if self.compute_dtype not in PRECISION_NAMES:
            raise ValueError(
                f"compute_dtype {self.compute_dtype} is not one of {list(PRECISION_NAMES)}: set one of them to save."
            )
        precision = PRECISION_NAMES[self.compute_dtype]
        th.save({"state_dict": self.state_dict(), "data": self._get_constructor_parameters(), "precision": precision}, path)

    @classmethod
    def load(cls: type[SelfPPGPolicy], path: str, device: th.device | str = "auto") -> SelfPPGPolicy:
        """
        Load a policy saved by :meth:`save`, at the precision it was saved with (files without one: float32).

        :param path: The file to read
        :param device: Device on which the policy should be loaded
        """
        device = get_device(device)
        saved = th.load(path, map_location=device, weights_only=False)
        policy = cls(**saved["data"])
        policy.load_state_dict(saved["state_dict"])
        policy.to(device)
        policy.compute_dtype = PRECISIONS[saved.get("precision", "fp32")]
        return policy

    def __getstate__(self) -> dict[str, Any]:
        """The state that pickle and ``copy.deepcopy`` copy: without the CUDA graphs and stream, rebuilt when used."""
        state = super().__getstate__()
        state["_rollout_graphs"] = None
        state["_value_stream"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A pickled policy's state; one pickled before ``cuda_graphs`` or ``parallel_networks`` existed goes without."""
        defaults = {"rollout_cuda_graphs": False, "_rollout_graphs": None, "parallel_networks": False, "_value_stream": None}
        for name, default in defaults.items():
            state.setdefault(name, default)
        super().__setstate__(state)

    def obs_to_tensor(self, observation: np.ndarray | dict[str, np.ndarray]) -> tuple[PyTorchObs, bool]:
        """SB3's conversion for ``predict``, after checking that a Dict observation has exactly the space's keys."""
        check_observation_keys(observation, self.observation_space)
        return super().obs_to_tensor(observation)

    def _features(self, obs: PyTorchObs, features_extractor: BaseFeaturesExtractor) -> th.Tensor:
        """
        Preprocess the observation (in the parameters' dtype) and run one features extractor, under autocast to
        ``compute_dtype`` when that is not float32.
        """
        dtype = self.action_net.weight.dtype
        preprocessed_obs = add_scalar_feature_axis(
            preprocess_obs_as(obs, self.observation_space, self.normalize_images, dtype), self.observation_space
        )
        if self.compute_dtype == th.float32:
            return features_extractor(preprocessed_obs)
        with th.autocast(device_type=self.device.type, dtype=self.compute_dtype):
            features = features_extractor(preprocessed_obs)
        return features.to(dtype)

    def extract_features(  # type: ignore[override]
        self, obs: PyTorchObs, features_extractor: BaseFeaturesExtractor | None = None
    ) -> th.Tensor | tuple[th.Tensor, th.Tensor]:
        """
        Preprocess the observation and extract features (see ``_features`` for the precision).

        :param obs: Observation
        :param features_extractor: The features extractor to use with a shared extractor (default: the policy's)
        :return: The features; for ``arch="dual"`` a tuple with the policy network's and the value network's
        """
        if self.share_features_extractor:
            return self._features(obs, self.features_extractor if features_extractor is None else features_extractor)
        return self._features(obs, self.pi_features_extractor), self._features(obs, self.vf_features_extractor)

    def _get_latents(self, obs: PyTorchObs, detach_value: bool) -> tuple[th.Tensor, th.Tensor]:
        """
        One pass through the networks: the policy latent and the latent the value head reads.

        :param detach_value: for the one-network architectures, stop the value head's gradient at the trunk
        """
        if self.arch == "dual":
            value_stream = self._parallel_value_stream()
            if value_stream is None:
                pi_features, vf_features = self.extract_features(obs)
                return self.mlp_extractor.forward_actor(pi_features), self.mlp_extractor.forward_critic(vf_features)
            with value_stream.branch():
                latent_vf = self.mlp_extractor.forward_critic(self._features(obs, self.vf_features_extractor))
            latent_pi = self.mlp_extractor.forward_actor(self._features(obs, self.pi_features_extractor))
            value_stream.join()
            return latent_pi, latent_vf
        latent_pi = self.mlp_extractor.forward_actor(self.extract_features(obs))
        return latent_pi, latent_pi.detach() if detach_value else latent_pi

    def _parallel_value_stream(self) -> SideStream | None:
        """The stream of the value network's branch with ``parallel_networks`` on a CUDA device, else None."""
        if not (self.parallel_networks and self.device.type == "cuda"):
            return None
        if self._value_stream is None or self._value_stream.device != self.device:
            self._value_stream = SideStream(self.device)
        return self._value_stream

    def get_distribution(self, obs: PyTorchObs) -> Distribution:
        """The current policy's action distribution for the observations (the policy network only)."""
        check_finite_observations(obs)
        latent_pi = self.mlp_extractor.forward_actor(self._features(obs, self.pi_features_extractor))
        return self._get_action_dist_from_latent(latent_pi)

    @property
    def _detach_value_in_policy_phase(self) -> bool:
        return self.arch == "detach"

    def forward(self, obs: th.Tensor, deterministic: bool = False) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """
        Forward pass in all the networks (actor and critic).

        :param obs: Observation
        :param deterministic: Whether to sample or use deterministic actions
        :return: action, value and log probability of the action
        """
        check_finite_observations(obs)
        latent_pi, values = self.rollout_latent_and_values(obs)
        with self._unchecked_sampling():
            distribution = self._get_action_dist_from_latent(latent_pi)
            actions = distribution.get_actions(deterministic=deterministic)
            log_prob = distribution.log_prob(actions)
        actions = actions.reshape((-1, *self.action_space.shape))  # type: ignore[misc]
        return actions, values, log_prob

    def _unchecked_sampling(self) -> AbstractContextManager:
        """
        Where the rollout samples its actions: without the distributions' argument checks (two host syncs per step on
        CUDA), for the action spaces whose sampling refuses non-finite parameters itself.
        """
        return unchecked_distributions(self.action_dist, sampling_checks_parameters(self.action_space))

    def rollout_latent_and_values(self, obs: PyTorchObs) -> tuple[th.Tensor, th.Tensor]:
        """
        The policy latent and the values of a rollout step, replayed from a CUDA graph when ``rollout_cuda_graphs``
        is set on a CUDA device without gradient (the same kernels: the same results; see docs/throughput.md).
        """
        if not (self.rollout_cuda_graphs and self.device.type == "cuda" and not th.is_grad_enabled()):
            return self._latent_and_values(obs)
        if self._rollout_graphs is None:
            self._rollout_graphs = GraphedForward(self._latent_and_values)
        key = (self.training, self.compute_dtype, self.parallel_networks, parameter_addresses(self))
        latent_pi, values = self._rollout_graphs(obs, key)
        return latent_pi, values

    def _latent_and_values(self, obs: PyTorchObs) -> tuple[th.Tensor, th.Tensor]:
        """The policy latent and the values of the policy phase's architecture (no action distribution)."""
        latent_pi, latent_vf = self._get_latents(obs, self._detach_value_in_policy_phase)
        return latent_pi, self.value_net(latent_vf)

    def evaluate_actions(self, obs: PyTorchObs, actions: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        """
        Evaluate actions according to the current policy, given the observations.

        :return: estimated value, log likelihood of taking those actions and entropy of the action distribution.
        """
        latent_pi, latent_vf = self._get_latents(obs, self._detach_value_in_policy_phase)
        distribution = self._get_action_dist_from_latent(latent_pi)
        log_prob = distribution.log_prob(actions)
        values = self.value_net(latent_vf)
        return values, log_prob, distribution.entropy()

    def predict_values(self, obs: PyTorchObs) -> th.Tensor:
        """Get the estimated values according to the current policy given the observations."""
        if self.arch == "dual":
            return self.value_net(self.mlp_extractor.forward_critic(self._features(obs, self.vf_features_extractor)))
        _, latent_vf = self._get_latents(obs, self._detach_value_in_policy_phase)
        return self.value_net(latent_vf)

    def forward_aux(self, obs: PyTorchObs) -> tuple[Distribution, th.Tensor, th.Tensor]:
        """The auxiliary phase's pass: the action distribution, the true value and the auxiliary value."""
        detach_value = self.arch == "detach" and self.detach_value_in_aux
        latent_pi, latent_vf = self._get_latents(obs, detach_value)
        distribution = self._get_action_dist_from_latent(latent_pi)
        return distribution, self.value_net(latent_vf), self.aux_value_net(latent_pi)


class PPGCnnPolicy(PPGPolicy):
    """
    PPG policy with SB3's ``NatureCNN`` features extractor (``"CnnPolicy"``). See ``PPGPolicy`` for the parameters.
    """

    default_features_extractor_class = NatureCNN


class PPGMultiInputPolicy(PPGPolicy):
    """
    PPG policy for Dict observations with SB3's ``CombinedExtractor`` (``"MultiInputPolicy"``).
    See ``PPGPolicy`` for the parameters.
    """

    default_features_extractor_class = CombinedExtractor


class ProcgenCnnPolicy(PPGPolicy):
    """
    The PPG paper's Procgen network (``"ProcgenCnn"``): ``PPGPolicy`` with the IMPALA CNN, ReLU, the heads on its
    256-d features and the paper's normalized initialization (see docs/ppg.md).
    """

    default_features_extractor_class = ImpalaCNN

    def __init__(
        self,
        *args: Any,
        activation_fn: type[nn.Module] = nn.ReLU,
        ortho_init: bool = False,
        normed_init: bool = True,
        **kwargs: Any,
    ):
        super().__init__(*args, activation_fn=activation_fn, ortho_init=ortho_init, normed_init=normed_init, **kwargs)


MlpPolicy = PPGPolicy
CnnPolicy = PPGCnnPolicy
MultiInputPolicy = PPGMultiInputPolicy
ProcgenCnn = ProcgenCnnPolicy
