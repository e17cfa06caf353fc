"""Network building blocks: the IMPALA CNN of the PPG paper and its normalized ("fan-in normed") initialization."""

import math

import torch as th
from gymnasium import spaces
from stable_baselines3.common.preprocessing import is_image_space
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

# Normed-init scale of the IMPALA dense layer and of the policy / value / aux value heads (paper's code).
IMPALA_DENSE_SCALE = 1.4
HEAD_SCALE = 0.1


def normed_init_(layer: nn.Module, scale: float = 1.0) -> None:
    """
    Rescale a linear or convolutional layer's weight in place so that each output unit's weight vector has L2 norm
    ``scale`` (its direction kept), and zero its bias: the paper's code's initialization.
    """
    if not isinstance(layer, (nn.Linear, nn.Conv2d)):
        raise TypeError(f"normed_init_ expects nn.Linear or nn.Conv2d, got {type(layer).__name__}")
    with th.no_grad():
        weight = layer.weight
        dims = tuple(range(1, weight.dim()))
        weight.mul_(scale / th.linalg.vector_norm(weight, dim=dims, keepdim=True))
        if layer.bias is not None:
            layer.bias.zero_()


class ImpalaResidualBlock(nn.Module):
    """``y = x + conv_b(relu(conv_a(relu(x))))`` with 3x3 convolutions that keep the channel count."""

    def __init__(self, channels: int, scale: float) -> None:
        super().__init__()
        self.conv_a = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv_b = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        normed_init_(self.conv_a, scale)
        normed_init_(self.conv_b, scale)

    def forward(self, x: th.Tensor) -> th.Tensor:
        out = self.conv_a(th.relu(x))
        out = self.conv_b(th.relu(out))
        return x + out


class ImpalaDownStack(nn.Module):
    """One IMPALA stack: conv 3x3 -> max-pool 3x3 stride 2 -> ``n_blocks`` residual blocks."""

    def __init__(self, in_channels: int, out_channels: int, n_blocks: int, block_scale: float) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        normed_init_(self.conv, 1.0)
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.blocks = nn.Sequential(*[ImpalaResidualBlock(out_channels, block_scale) for _ in range(n_blocks)])

    def forward(self, x: th.Tensor) -> th.Tensor:
        return self.blocks(self.pool(self.conv(x)))


class ImpalaCNN(BaseFeaturesExtractor):
    """
    The IMPALA CNN encoder of the PPG paper: stacks of (conv 3x3, max-pool 3x3/2, residual blocks), then flatten ->
    ReLU -> Linear(features_dim) -> ReLU, with the paper's code's normalized initialization (see docs/ppg.md). It
    expects channel-first images scaled to [0, 1] (SB3 transposes and scales uint8 images).

    :param observation_space: the image observation space (channel-first)
    :param features_dim: size of the output features (256 in the paper)
    :param channels: output channels of each stack ((16, 32, 32) in the paper)
    :param n_blocks: residual blocks per stack (2 in the paper)
    :param normalized_image: whether the image is already normalized (SB3 sets it with ``normalize_images=False``)
    :param channels_last: run the convolutions in the channels-last memory layout (same results; faster)
    """

    def __init__(
        self,
        observation_space: spaces.Box,
        features_dim: int = 256,
        channels: tuple[int, ...] = (16, 32, 32),
        n_blocks: int = 2,
        normalized_image: bool = False,
        channels_last: bool = True,
    ) -> None:
        if not isinstance(observation_space, spaces.Box) or len(observation_space.shape) != 3:
            raise ValueError(
                f"ImpalaCNN needs an image observation space (a 3-D Box), got {observation_space}. "
                "Use 'MlpPolicy' for vector observations or 'MultiInputPolicy' for Dict observations."
            )
        if not normalized_image and not is_image_space(observation_space, check_channels=False):
            raise ValueError(
                f"ImpalaCNN expects uint8 images in [0, 255], got {observation_space}. If your images are already "
                "normalized floats, pass policy_kwargs=dict(normalize_images=False)."
            )
        if len(channels) == 0 or n_blocks < 0:
            raise ValueError(
                f"ImpalaCNN needs at least one stack and n_blocks >= 0, got channels={channels}, n_blocks={n_blocks}"
            )
        super().__init__(observation_space, features_dim)
        in_channels = observation_space.shape[0]
        # Stack scale 1/sqrt(n_stacks), divided by sqrt(n_blocks), then the square root because each block has
        # two convolutions: 6 ** -0.25 ~= 0.639 with 3 stacks of 2 blocks.
        block_scale = math.sqrt(1.0 / math.sqrt(len(channels)) / math.sqrt(max(n_blocks, 1)))
        stacks = []
        for out_channels in channels:
            stacks.append(ImpalaDownStack(in_channels, out_channels, n_blocks, block_scale))
            in_channels = out_channels
        self.stacks = nn.Sequential(*stacks)
        with th.no_grad():
            sample = th.zeros((1, *observation_space.shape), dtype=th.float32)
            n_flatten = self.stacks(sample).flatten(1).shape[1]
        self.dense = nn.Linear(n_flatten, features_dim)
        normed_init_(self.dense, IMPALA_DENSE_SCALE)
        self.memory_format = th.channels_last if channels_last else th.contiguous_format
        self.stacks.to(memory_format=self.memory_format)

    def forward(self, observations: th.Tensor) -> th.Tensor:
        hidden = self.stacks(observations.contiguous(memory_format=self.memory_format))
        # flatten() in (C, H, W) order whatever the memory layout
        return th.relu(self.dense(th.relu(hidden.flatten(1))))
