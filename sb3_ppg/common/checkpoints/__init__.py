"""Checkpoints that resume a PPG run exactly: one module per on-disk format, each written and read side by side."""
