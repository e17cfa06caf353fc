"""``python -m sb3_ppg.plot``: the command line's plot program, :mod:`sb3_ppg.cli.plot`."""

from sb3_ppg.cli.plot import main

__all__ = ["main"]
