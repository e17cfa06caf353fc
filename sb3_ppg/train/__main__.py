"""``python -m sb3_ppg.train``: runs :func:`sb3_ppg.cli.train.main`."""

from sb3_ppg.cli.train import main

main()
