"""``python -m sb3_ppg.train``: the command line's train program, :mod:`sb3_ppg.cli.train`."""

from sb3_ppg.cli.train import main

__all__ = ["main"]
