"""
The network layers' old module path, kept for model zips saved before they moved to :mod:`sb3_ppg.common.torch_layers`
(a zip names a features extractor given in ``policy_kwargs`` by module path). Import from there instead.
"""

from sb3_ppg.common.torch_layers import ImpalaCNN, ImpalaDownStack, ImpalaResidualBlock

__all__ = ["ImpalaCNN", "ImpalaDownStack", "ImpalaResidualBlock"]
