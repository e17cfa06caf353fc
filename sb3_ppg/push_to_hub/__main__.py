"""``python -m sb3_ppg.push_to_hub``: runs :func:`sb3_ppg.cli.hub.push_to_hub` (errors in one line)."""

from sb3_ppg.cli.hub import main

main("push_to_hub")
