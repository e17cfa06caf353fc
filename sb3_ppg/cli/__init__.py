"""
The command line (``python -m sb3_ppg.train / enjoy / plot``) on top of the RL Baselines3 Zoo: the zoo glue, the
experiment manager, the three programs, the packaged hyperparameters and the paper's learning curves.
"""
