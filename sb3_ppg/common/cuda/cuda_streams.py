"""
A second CUDA stream for an independent branch of a forward pass: ``arch="dual"``'s value network beside its policy
network (``PPG(parallel_networks=True)``, see docs/throughput.md). The branch runs the same kernels on the same
inputs, so its results are those of the sequential pass; the backward pass runs each kernel's gradient on the stream
its forward kernel used, and waits where the branches meet.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch as th


class SideStream:
    """
    A CUDA stream that runs one branch of a forward pass while the current stream runs the other.

    Memory: the branch reads tensors of the current stream (the observations) and the current stream reads the
    branch's outputs; both are kept alive by the caller until ``join()``, after which every later use of their memory
    on either stream is ordered after the branch (``branch()`` starts by waiting for the current stream).

    :param device: the CUDA device
    """

    def __init__(self, device: th.device) -> None:
        self.device = device
        self.stream = th.cuda.Stream(device=device)

    @contextmanager
    def branch(self) -> Iterator[None]:
        """Inside: the side stream, after everything the current stream was given so far."""
        self.stream.wait_stream(th.cuda.current_stream(self.device))
        with th.cuda.stream(self.stream):
            yield

    def join(self) -> None:
        """The current stream waits for everything the branch was given so far."""
        th.cuda.current_stream(self.device).wait_stream(self.stream)
