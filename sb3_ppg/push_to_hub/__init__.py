"""``python -m sb3_ppg.push_to_hub``: the command line's push_to_hub program, :func:`sb3_ppg.cli.hub.push_to_hub`."""

from sb3_ppg.cli.hub import push_to_hub

__all__ = ["push_to_hub"]
