"""Test-suite settings: one torch thread per process (the suite runs with one worker per core, see pyproject.toml)."""

import os

# Inherited by the subprocesses some tests start (command-line entry points, examples)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch as th

th.set_num_threads(1)
