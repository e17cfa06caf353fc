"""
What PPG is built on, and what runs, saves and scales it: buffers, distributions, torch layers, precision, hyperparameter
checks, callbacks, checkpoints and data-parallel training. Nothing here imports the algorithm (:mod:`sb3_ppg.ppg`) or
the command line (:mod:`sb3_ppg.cli`).
"""
