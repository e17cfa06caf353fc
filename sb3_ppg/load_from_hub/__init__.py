"""``python -m sb3_ppg.load_from_hub``: the command line's load_from_hub program, :func:`sb3_ppg.cli.hub.load_from_hub`."""

from sb3_ppg.cli.hub import load_from_hub

__all__ = ["load_from_hub"]
