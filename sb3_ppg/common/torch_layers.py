"""Network building blocks: the IMPALA CNN of the PPG paper and its normalized ("fan-in normed") initialization."""

import math

import torch as th
import torch.nn.functional as F
from gymnasium import spaces
from stable_baselines3.common.preprocessing import is_image_space
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

# Normed-init scale of the IMPALA dense layer and of the policy / value / aux value heads (paper's code).
IMPALA_DENSE_SCALE = 1.4
HEAD_SCALE = 0.1
#: Whether ImpalaDownStack backpropagates its max-pools on CUDA with :class:`MaxPool3x3Stride2` (else with ATen's)
CUDA_GATHER_MAX_POOL_BACKWARD = True


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


class MaxPool3x3Stride2(th.autograd.Function):
    """
    The IMPALA stack's max-pool (kernel 3, stride 2, padding 1) with ATen's forward and a gather-style backward made of
    plain torch operations without atomics, meant to beat ATen's channels-last bf16 backward kernel on CUDA
    (docs/throughput.md, benchmarks/max_pool_backward.py). Call it as ``MaxPool3x3Stride2.apply(x)`` on a 4-D
    ``(N, C, H, W)`` tensor.

    The gradient of each output goes to the input element that ATen's forward index names (ATen's tie routing). Each
    input element receives at most 4 contributions, added in float32 (float64 for float64 inputs) in increasing
    ``(oh, ow)`` order of the outputs, starting from zero (an element with one covering output copies its gradient),
    then rounded once to the input dtype: the summation of ATen's CUDA backward kernels, signed zeros included (hence
    expected to match them bit for bit), and of its CPU kernel in float32 and float64, where the input gradient is
    ATen's up to the sign of zeros (tests/test_max_pool.py). In bf16 or float16 it is the
    float32 sum rounded once: within half an ulp of the input dtype of the exact sum, plus ``3 * 2**-24`` of the sum
    of the contributions' magnitudes.
    """

    @staticmethod
    def forward(ctx, x: th.Tensor) -> th.Tensor:  # type: ignore[override]
        """:param x: the input, ``(N, C, H, W)``"""
        output, indices = F.max_pool2d(x, kernel_size=3, stride=2, padding=1, return_indices=True)
        ctx.save_for_backward(indices)
        ctx.input_shape = x.shape
        ctx.channels_last = x.is_contiguous(memory_format=th.channels_last) and not x.is_contiguous()
        return output

    @staticmethod
    @th.autograd.function.once_differentiable
    def backward(ctx, grad_output: th.Tensor) -> th.Tensor:  # type: ignore[override]
        """:param grad_output: the gradient of the output, ``(N, C, OH, OW)``"""
        (indices,) = ctx.saved_tensors
        memory_format = th.channels_last if ctx.channels_last else th.contiguous_format
        grad_input = th.empty(ctx.input_shape, dtype=grad_output.dtype, device=grad_output.device, memory_format=memory_format)
        max_pool_3x3_stride_2_backward_into(grad_input, grad_output, indices)
        return grad_input


def max_pool_3x3_stride_2_backward_into(grad_input: th.Tensor, grad_output: th.Tensor, indices: th.Tensor) -> None:
    """
    Write the input gradient of a 3x3 stride-2 padding-1 max-pool into ``grad_input`` (see :class:`MaxPool3x3Stride2`).

    Input row ``2 * a`` is covered by output row ``a`` alone (window offset ``dy = 1``); input row ``2 * a + 1`` by
    output rows ``a`` (``dy = 2``) and ``a + 1`` (``dy = 0``, absent for the last row of an even height); the same for
    columns. Each of the four (row parity, column parity) classes of input elements is a strided slice of
    ``grad_input``: the sum of its (at most four) shifted, masked gradient slices, kept in float32 (or float64) until
    it is written in the input's dtype.

    :param grad_input: the input gradient to write, ``(N, C, H, W)``, in the input's dtype
    :param grad_output: the gradient of the output, ``(N, C, OH, OW)``
    :param indices: ATen's forward indices (flat ``h * W + w`` per plane), the shape of ``grad_output``
    """
    height, width = grad_input.shape[-2:]
    out_height, out_width = indices.shape[-2:]
    device = indices.device
    # Each output's argmax relative to its window's top-left corner (-1, -1): dy * width + dx
    rows = th.arange(out_height, device=device).mul_(2).sub_(1).mul_(width)
    columns = th.arange(out_width, device=device).mul_(2).sub_(1)
    offsets = indices - (rows[:, None] + columns[None, :])
    offsets = offsets.to(th.int16 if 2 * width + 2 <= th.iinfo(th.int16).max else th.int32)
    accumulate_dtype = th.float64 if grad_output.dtype == th.float64 else th.float32
    zero = th.zeros((), dtype=grad_output.dtype, device=device)
    # A 1-element tensor (not 0-dim) takes part in type promotion: th.where with it gives float32 sums directly
    accumulate_zero = th.zeros(1, dtype=accumulate_dtype, device=device)
    # ATen's CUDA kernels start the sum of an element with two or more covering outputs at +0 (so -0 + -0 gives +0)
    # and copy the gradient of an element with one covering output: adding the second and later terms with -0 made +0
    # gives the same bits, and the first term is copied
    # Per parity: (first input row, (window offset, first output row, count) of each covering output in order)
    row_classes = _parity_classes(height, out_height)
    column_classes = _parity_classes(width, out_width)
    later_grad_output = grad_output + 0 if height > 2 or width > 2 else grad_output
    for first_row, row_terms in row_classes:
        for first_column, column_terms in column_classes:
            target = grad_input[..., first_row::2, first_column::2]
            # The class's first term covers all of it: written straight into grad_input where no rounding follows
            in_place = len(row_terms) * len(column_terms) == 1 or grad_input.dtype == accumulate_dtype
            total = None
            for dy, out_row, n_rows in row_terms:
                for dx, out_column, n_columns in column_terms:
                    window = (..., slice(out_row, out_row + n_rows), slice(out_column, out_column + n_columns))
                    mask = offsets[window] == dy * width + dx
                    if total is None and in_place:
                        total = th.where(mask, grad_output[window], zero, out=target)
                    elif total is None:
                        total = th.where(mask, grad_output[window], accumulate_zero)
                    else:
                        total[..., :n_rows, :n_columns] += th.where(mask, later_grad_output[window], zero)
            if not in_place:
                target.copy_(total)


def _parity_classes(size: int, out_size: int) -> list[tuple[int, list[tuple[int, int, int]]]]:
    """
    :param size: the input's height (or width)
    :param out_size: the output's
    :return: for the even and odd input rows (if any), the first row and its covering outputs in increasing order:
        (window offset, first output row, count); the first covers every row of the parity
    """
    classes = [(0, [(1, 0, out_size)])]
    n_odd = size // 2
    if n_odd > 0:
        odd_terms = [(2, 0, n_odd)]
        if out_size > 1:
            odd_terms.append((0, 1, min(n_odd, out_size - 1)))
        classes.append((1, odd_terms))
    return classes


class ImpalaDownStack(nn.Module):
    """One IMPALA stack: conv 3x3 -> max-pool 3x3 stride 2 -> ``n_blocks`` residual blocks."""

    def __init__(self, in_channels: int, out_channels: int, n_blocks: int, block_scale: float) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        normed_init_(self.conv, 1.0)
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.blocks = nn.Sequential(*[ImpalaResidualBlock(out_channels, block_scale) for _ in range(n_blocks)])

    def forward(self, x: th.Tensor) -> th.Tensor:
        x = self.conv(x)
        # On CUDA the max-pool's backward is the gather-style one (faster there, same gradients); elsewhere ATen's
        if CUDA_GATHER_MAX_POOL_BACKWARD and x.is_cuda and x.requires_grad:
            x = MaxPool3x3Stride2.apply(x)
        else:
            x = self.pool(x)
        return self.blocks(x)


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
