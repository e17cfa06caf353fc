"""The evaluation callback of MaskablePPG runs that are checkpointed and resumed."""

from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback

from sb3_ppg.common.callbacks import PPGEvalCallback


class MaskablePPGEvalCallback(PPGEvalCallback, MaskableEvalCallback):
    """
    :class:`~sb3_ppg.PPGEvalCallback` (evaluations on their own random streams, every ``eval_freq`` calls from the run's
    start, the log kept when a run resumes) whose evaluations are sb3-contrib's ``MaskableEvalCallback``'s: the eval
    env's action masks are given to ``predict``. The RL Zoo command line uses it for ``--algo maskable_ppg``.

    :param args: The arguments of SB3's ``EvalCallback``
    :param seed: see :class:`~sb3_ppg.PPGEvalCallback`
    :param use_masking: give the eval env's action masks to ``predict`` (True, default)
    :param kwargs: The keyword arguments of SB3's ``EvalCallback``
    """
