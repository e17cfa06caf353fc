"""
The IMPALA stack's max-pool with a gather-style backward (``MaxPool3x3Stride2``, sb3_ppg/common/torch_layers.py): its
forward is ATen's and its input gradient is ATen's max_pool2d gradient bit for bit in float64 and float32 (same
contributions, same summation order), and in bf16 / float16 the float32 sum rounded once (what ATen's CUDA kernels
compute), within the bound derived below of the exact sum. CUDA runs it in ImpalaDownStack; the CPU keeps ATen's.
"""

import pytest
import torch as th
import torch.nn.functional as F

from sb3_ppg.common import torch_layers
from sb3_ppg.common.torch_layers import ImpalaDownStack, MaxPool3x3Stride2

requires_cuda = pytest.mark.skipif(not th.cuda.is_available(), reason="needs a CUDA device")

#: Odd and even heights and widths, the IMPALA stacks' 64 -> 32 -> 16 -> 8, and the smallest planes
SIZES = [(16, 16), (7, 9), (1, 1), (2, 2), (3, 2), (8, 5), (1, 6), (64, 64)]


def make_input(size: tuple[int, int], inputs: str, dtype: th.dtype, channels_last: bool, seed: int) -> th.Tensor:
    """
    :param inputs: "random" (no ties), "integers" (values in {0, 1, 2}: many ties) or "constant" (all windows tied)
    :return: a (2, 3, H, W) input in ``dtype`` and the layout asked for
    """
    generator = th.Generator().manual_seed(seed)
    shape = (2, 3, *size)
    if inputs == "random":
        x = th.randn(shape, generator=generator, dtype=th.float64)
    elif inputs == "integers":
        x = th.randint(0, 3, shape, generator=generator).double()
    else:
        x = th.full(shape, 0.5, dtype=th.float64)
    x = x.to(dtype)
    return x.contiguous(memory_format=th.channels_last) if channels_last else x


def pool_and_grad(pool, x: th.Tensor, grad_output: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """:return: the pool's output on ``x`` and the gradient of ``x`` for ``grad_output``"""
    x = x.detach().clone().requires_grad_()
    output = pool(x)
    output.backward(grad_output)
    return output.detach(), x.grad


def aten_pool(x: th.Tensor) -> th.Tensor:
    return F.max_pool2d(x, kernel_size=3, stride=2, padding=1)


def random_grad_output(x: th.Tensor, seed: int) -> th.Tensor:
    out_shape = (*x.shape[:2], (x.shape[2] + 1) // 2, (x.shape[3] + 1) // 2)
    generator = th.Generator().manual_seed(seed)
    return th.randn(out_shape, generator=generator, dtype=th.float64).to(x.dtype)


@pytest.mark.parametrize("dtype", [th.float64, th.float32])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("inputs", ["random", "integers", "constant"])
@pytest.mark.parametrize("size", SIZES)
def test_gradients_equal_atens(size, inputs, channels_last, dtype):
    # A dropped window offset, a wrong border or another summation order changes some of these gradients
    x = make_input(size, inputs, dtype, channels_last, seed=size[0] * 100 + size[1])
    grad_output = random_grad_output(x, seed=1)
    expected_output, expected_grad = pool_and_grad(aten_pool, x, grad_output)
    output, grad = pool_and_grad(MaxPool3x3Stride2.apply, x, grad_output)
    assert th.equal(output, expected_output)
    assert grad.dtype == dtype and th.equal(grad, expected_grad)
    assert grad.stride() == expected_grad.stride()  # ATen's layout for the input gradient


def cuda_kernel_reference(indices: th.Tensor, grad_output: th.Tensor, size: tuple[int, int]) -> th.Tensor:
    """
    ATen's CUDA max-pool backward, element by element (its kernels for both layouts): an input element covered by one
    output gets that output's gradient if the output's index names it (else +0); one covered by several starts at +0
    in float32 (float64 for float64) and adds the gradients of the outputs that name it, in increasing (oh, ow) order.
    """
    height, width = size
    out_height, out_width = grad_output.shape[-2:]
    accumulate_dtype = th.float64 if grad_output.dtype == th.float64 else th.float32
    grad_input = th.zeros((*grad_output.shape[:2], height, width), dtype=grad_output.dtype)
    for n in range(grad_output.shape[0]):
        for c in range(grad_output.shape[1]):
            for h in range(height):
                for w in range(width):
                    covering = [
                        (oh, ow)
                        for oh in range(out_height)
                        for ow in range(out_width)
                        if abs(h - 2 * oh) <= 1 and abs(w - 2 * ow) <= 1
                    ]
                    named = [(oh, ow) for oh, ow in covering if indices[n, c, oh, ow] == h * width + w]
                    if len(covering) == 1:
                        if named:
                            grad_input[n, c, h, w] = grad_output[n, c, named[0][0], named[0][1]]
                        continue
                    total = th.zeros((), dtype=accumulate_dtype)
                    for oh, ow in named:
                        total = total + grad_output[n, c, oh, ow].to(accumulate_dtype)
                    grad_input[n, c, h, w] = total.to(grad_output.dtype)
    return grad_input


def bits(tensor: th.Tensor) -> th.Tensor:
    """:return: the tensor's bits as integers (so that -0.0 and +0.0 differ)"""
    integer_dtype = {th.float64: th.int64, th.float32: th.int32, th.bfloat16: th.int16, th.float16: th.int16}
    return tensor.contiguous().view(integer_dtype[tensor.dtype])


@pytest.mark.parametrize("dtype", [th.float64, th.float32, th.bfloat16])
@pytest.mark.parametrize("size", [(7, 9), (6, 4), (5, 5), (2, 3), (1, 1)])
def test_gradient_bits_are_the_cuda_kernels(size, dtype):
    # Signed zeros among the gradients: one covering output copies its gradient (-0 stays -0), two or more sum from +0
    # (-0 + -0 gives +0); the CPU kernel sums from +0 everywhere, so the CPU comparisons above see values only
    x = make_input(size, "integers", dtype, channels_last=True, seed=5)
    grad_output = random_grad_output(x, seed=6)
    generator = th.Generator().manual_seed(7)
    signed_zeros = th.rand(grad_output.shape, generator=generator)
    grad_output[signed_zeros < 0.4] = -0.0
    grad_output[signed_zeros > 0.8] = 0.0
    _, indices = F.max_pool2d(x, kernel_size=3, stride=2, padding=1, return_indices=True)
    _, grad = pool_and_grad(MaxPool3x3Stride2.apply, x, grad_output)
    expected = cuda_kernel_reference(indices, grad_output, size)
    assert th.equal(bits(grad), bits(expected))
    if size == (7, 9):  # the case is there: a -0 copied and a -0 + -0 made +0
        assert (bits(expected) == bits(th.tensor(-0.0, dtype=dtype))).any()


def test_non_finite_gradients_go_where_atens_go():
    # Each output's gradient reaches its argmax only: an infinite or NaN gradient spoils no other input element
    x = make_input((9, 8), "integers", th.float32, channels_last=True, seed=3)
    grad_output = random_grad_output(x, seed=4)
    grad_output[0, 0, 1, 1], grad_output[0, 1, 2, 2], grad_output[1, 2, 0, 3] = float("inf"), -float("inf"), float("nan")
    _, expected_grad = pool_and_grad(aten_pool, x, grad_output)
    _, grad = pool_and_grad(MaxPool3x3Stride2.apply, x, grad_output)
    assert not expected_grad.isfinite().all() and expected_grad.isfinite().any()
    th.testing.assert_close(grad, expected_grad, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [th.bfloat16, th.float16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("inputs", ["random", "integers"])
@pytest.mark.parametrize("size", SIZES)
def test_half_precision_gradients(size, inputs, channels_last, dtype):
    x = make_input(size, inputs, dtype, channels_last, seed=size[0] * 100 + size[1])
    grad_output = random_grad_output(x, seed=2)
    output, grad = pool_and_grad(MaxPool3x3Stride2.apply, x, grad_output)
    assert th.equal(output, aten_pool(x))
    assert grad.dtype == dtype
    # Exactly the float32 sum of the same contributions rounded once: ATen's float32 gradient (upcasting is exact, so
    # the forward picks the same elements) cast to the input dtype, which is what ATen's CUDA kernels compute
    _, grad_float32 = pool_and_grad(aten_pool, x.float(), grad_output.float())
    assert th.equal(grad, grad_float32.to(dtype))
    # Against the exact sum S of an element's k <= 4 contributions g_i (float64: its own error <= 3 * 2**-53 * sum|g_i|):
    # float32's 3 additions err by <= 3 * 2**-24 * sum|g_i|, the final rounding by <= u * |sum32| with u = 2**-8 (bf16)
    # or 2**-11 (float16); u * |sum32| <= u * |S| + u * 3 * 2**-24 * sum|g_i|, so 2**-22 * sum|g_i| covers the rest
    _, exact = pool_and_grad(aten_pool, x.double(), grad_output.double())
    _, magnitude = pool_and_grad(aten_pool, x.double(), grad_output.double().abs())
    unit_roundoff = 2.0**-8 if dtype == th.bfloat16 else 2.0**-11
    bound = unit_roundoff * exact.abs() + 2.0**-22 * magnitude
    assert ((grad.double() - exact).abs() <= bound).all()


def test_impala_stack_pools_with_aten_on_the_cpu():
    # On a CPU the stack keeps ATen's max-pool (golden checksums); on CUDA it uses MaxPool3x3Stride2 when training
    stack = ImpalaDownStack(3, 4, n_blocks=0, block_scale=1.0)
    x = th.rand(2, 3, 8, 8)
    names = autograd_node_names(stack(x))
    assert any(name.startswith("MaxPool2DWithIndicesBackward") for name in names)
    assert not any("MaxPool3x3Stride2" in name for name in names)


@requires_cuda
@pytest.mark.parametrize("dtype", [th.bfloat16, th.float32])
@pytest.mark.parametrize("channels_last", [False, True])
def test_cuda_gradients_equal_atens(dtype, channels_last):
    # ATen's CUDA kernels sum each input element's contributions in float32 in increasing (oh, ow) order and round
    # once: the same sums, so the same bits in bf16 too
    for channels, size in [(16, 64), (32, 32), (32, 16), (3, 7)]:
        x = th.randn(8, channels, size, size + 1, device="cuda").to(dtype)
        x = th.where(th.rand_like(x, dtype=th.float32) < 0.3, th.zeros_like(x), x)  # ties
        x = x.contiguous(memory_format=th.channels_last) if channels_last else x.contiguous()
        grad_output = random_grad_output(x.cpu(), seed=size)
        grad_output[th.rand(grad_output.shape) < 0.2] = -0.0  # signed zeros: copied or summed from +0, as ATen does
        grad_output = grad_output.cuda()
        expected_output, expected_grad = pool_and_grad(aten_pool, x, grad_output)
        output, grad = pool_and_grad(MaxPool3x3Stride2.apply, x, grad_output)
        assert th.equal(output, expected_output) and th.equal(bits(grad), bits(expected_grad))


@requires_cuda
def test_impala_stack_pools_with_the_gather_backward_on_cuda(monkeypatch):
    stack = ImpalaDownStack(3, 4, n_blocks=0, block_scale=1.0).cuda()
    names = autograd_node_names(stack(th.rand(2, 3, 8, 8, device="cuda")))
    assert any("MaxPool3x3Stride2" in name for name in names)
    with th.no_grad():  # no backward: ATen's pool as before (the rollout's CUDA graphs capture it)
        assert stack(th.rand(2, 3, 8, 8, device="cuda")).grad_fn is None
    monkeypatch.setattr(torch_layers, "CUDA_GATHER_MAX_POOL_BACKWARD", False)
    names = autograd_node_names(stack(th.rand(2, 3, 8, 8, device="cuda")))
    assert any(name.startswith("MaxPool2DWithIndicesBackward") for name in names)


def autograd_node_names(output: th.Tensor) -> list[str]:
    """:return: the names of the autograd graph's nodes behind ``output``"""
    names, stack, seen = [], [output.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(node.name())
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names
