"""``python -m sb3_ppg.enjoy``: runs :func:`sb3_ppg.cli.enjoy.main`."""

from sb3_ppg.cli.enjoy import main

main()
