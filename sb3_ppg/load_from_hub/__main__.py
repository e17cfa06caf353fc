"""``python -m sb3_ppg.load_from_hub``: runs :func:`sb3_ppg.cli.hub.load_from_hub` (errors in one line)."""

from sb3_ppg.cli.hub import main

main("load_from_hub")
