"""The evaluation callback of MaskablePPG runs that are checkpointed and resumed."""

from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback

from sb3_ppg.common.callbacks import PPGEvalCallback


class MaskablePPGEvalCallback(PPGEvalCallback, MaskableEvalCallback):
    """
    :class:`~sb3_ppg.PPGEvalCallback` whose evaluations are sb3-contrib's ``MaskableEvalCallback``'s (the eval env's
    action masks given to ``predict``); the command line's for ``--algo maskable_ppg``.

    :param seed: see :class:`~sb3_ppg.PPGEvalCallback`
    :param use_masking: give the eval env's action masks to ``predict``
    """
