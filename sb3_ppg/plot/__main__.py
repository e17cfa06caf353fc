"""``python -m sb3_ppg.plot``: runs :func:`sb3_ppg.cli.plot.main`."""

from sb3_ppg.cli.plot import main

main()
