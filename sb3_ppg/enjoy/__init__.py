"""``python -m sb3_ppg.enjoy``: the command line's enjoy program, :mod:`sb3_ppg.cli.enjoy`."""

from sb3_ppg.cli.enjoy import main

__all__ = ["main"]
