"""
CUDA graphs of the rollout's forward pass: its kernels captured once per input layout and replayed at every step, so
that a step costs one launch instead of hundreds (see docs/throughput.md). The replay runs the captured kernels on
the same inputs: the same results as the pass it replaces.
"""

import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch as th
from stable_baselines3.common.type_aliases import PyTorchObs
from torch import nn

#: A forward pass: observations -> a tuple of tensors
ForwardFunction = Callable[[PyTorchObs], tuple[th.Tensor, ...]]


def input_layout(observations: PyTorchObs) -> tuple:
    """The shapes, dtypes and devices of observations (a tensor or a dict of tensors): one graph each."""
    if isinstance(observations, dict):
        return tuple((key, *input_layout(value)) for key, value in sorted(observations.items()))
    return (tuple(observations.shape), observations.dtype, observations.device)


def parameter_addresses(module: nn.Module) -> tuple[int, ...]:
    """
    Where a module's parameters and buffers live: a graph reads them there, so a graph captured before they moved
    (``module.to()``, a ``load_state_dict(assign=True)``) is not replayed after.
    """
    addresses: list[int] = []
    seen: set[int] = set()
    modules = [module]
    # The live module tree walked without the parameters' names that ``module.parameters()`` builds: a rollout step
    # reads the addresses, at a third of the cost for the IMPALA policies (docs/throughput.md)
    while modules:
        current = modules.pop()
        if id(current) in seen:  # a module registered twice (e.g. a shared features extractor)
            continue
        seen.add(id(current))
        for tensor in (*current._parameters.values(), *current._buffers.values()):
            if tensor is not None:
                addresses.append(tensor.data_ptr())
        for child in current._modules.values():
            if child is not None:
                modules.append(child)
    return tuple(addresses)


def _clone(observations: PyTorchObs) -> PyTorchObs:
    if isinstance(observations, dict):
        return {key: value.clone() for key, value in observations.items()}
    return observations.clone()


def _copy_into(static: PyTorchObs, observations: PyTorchObs) -> None:
    if isinstance(static, dict):
        for key, value in static.items():
            value.copy_(observations[key])  # type: ignore[index]
    else:
        static.copy_(observations)  # type: ignore[arg-type]


class CapturedForward:
    """
    One captured forward pass: its static inputs, the graph and its static outputs.

    :param function: the forward pass
    :param observations: example inputs of the layout to capture (copied)
    """

    def __init__(self, function: ForwardFunction, observations: PyTorchObs) -> None:
        self.static_inputs = _clone(observations)
        tensors = self.static_inputs.values() if isinstance(self.static_inputs, dict) else [self.static_inputs]
        device = next(iter(tensors)).device
        # Warm-up on a side stream (lazy initializations, allocator), where a pass that waits for the device (which a
        # capture cannot hold, and whose failed capture would leave torch's CUDA generator unusable) raises first
        stream = th.cuda.Stream(device)
        stream.wait_stream(th.cuda.current_stream(device))
        sync_debug_mode = th.cuda.get_sync_debug_mode()
        th.cuda.set_sync_debug_mode("error")
        try:
            with th.cuda.stream(stream):
                for _ in range(2):
                    function(self.static_inputs)
        finally:
            th.cuda.set_sync_debug_mode(sync_debug_mode)
        th.cuda.current_stream(device).wait_stream(stream)
        self.graph = th.cuda.CUDAGraph()
        with th.cuda.graph(self.graph):
            self.static_outputs = function(self.static_inputs)

    def __call__(self, observations: PyTorchObs) -> tuple[th.Tensor, ...]:
        """Replay the graph on ``observations``; the outputs are copies (the next replay overwrites the graph's)."""
        _copy_into(self.static_inputs, observations)
        self.graph.replay()
        return tuple(output.clone() for output in self.static_outputs)


class GraphedForward:
    """
    A forward pass without gradient replayed from CUDA graphs: one graph per input layout and key, captured on first
    use; a capture that fails leaves that layout to the plain pass, with a warning.

    :param function: the forward pass (observations -> tuple of tensors), run without gradient
    :param max_graphs: the most graphs kept (the least recently used is dropped)
    """

    def __init__(self, function: ForwardFunction, max_graphs: int = 8) -> None:
        self.function = function
        self.max_graphs = max_graphs
        self.graphs: OrderedDict[Hashable, CapturedForward] = OrderedDict()
        #: The keys whose capture failed: they run the plain pass
        self.failed: set[Hashable] = set()

    def __call__(self, observations: PyTorchObs, key: Hashable = ()) -> tuple[th.Tensor, ...]:
        """
        The forward pass on ``observations`` (from a graph when it can be).

        :param key: what else the graph depends on (the parameters' addresses, the precision, ...)
        """
        full_key = (key, input_layout(observations))
        captured = self.graphs.get(full_key)
        if captured is None:
            if full_key in self.failed:
                return self.function(observations)
            captured = self._capture(observations, full_key)
            if captured is None:
                return self.function(observations)
        self.graphs.move_to_end(full_key)
        return captured(observations)

    def _capture(self, observations: PyTorchObs, key: Hashable) -> CapturedForward | None:
        """Capture the pass for ``key`` (None when it cannot be captured: it then runs without graphs)."""
        try:
            captured = CapturedForward(self.function, observations)
        except Exception as error:  # any failure of the user's network leaves the plain pass
            self.failed.add(key)
            warnings.warn(
                f"The rollout's forward pass could not be captured in a CUDA graph ({type(error).__name__}: {error}); "
                "it runs without graphs (the same results, slower). A network that synchronizes with the host or "
                "changes shape inside its forward cannot be captured; pass cuda_graphs=False to PPG to silence this.",
                stacklevel=3,
            )
            return None
        self.graphs[key] = captured
        while len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)
        return captured
