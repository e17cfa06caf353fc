"""
``python -m sb3_ppg.enjoy --algo maskable_ppg``: the RL Zoo's ``enjoy`` playing MaskablePPG models with the masks of
the env they play in (the zoo's ``enjoy`` calls ``model.predict(obs)`` without masks).
"""

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

from stable_baselines3.common.vec_env import VecEnv

from sb3_ppg.cli.algorithms import PPG_ALGORITHMS
from sb3_ppg.ppg_mask import MaskablePPG, MaskedPlayer


class MaskedPlayerLoader:
    """
    What the zoo's ``ALGOS`` registry holds for a MaskablePPG algorithm while its ``enjoy`` runs: ``load()`` loads the
    model and returns a :class:`~sb3_ppg.ppg_mask.MaskedPlayer` of it in the env that ``enjoy`` created, so that each
    ``predict()`` acts among that env's valid actions.

    :param algorithm_class: the algorithm (``MaskablePPG`` or a subclass)
    """

    def __init__(self, algorithm_class: type[MaskablePPG]) -> None:
        self.algorithm_class = algorithm_class
        #: The env the zoo's ``enjoy`` plays in (set by :func:`zoo_plays_with_masks` when ``enjoy`` creates it)
        self.env: VecEnv | None = None

    def load(self, path: str, **kwargs: Any) -> MaskedPlayer:
        """
        Load the model (``algorithm_class.load(path, **kwargs)``) and return its player in the env.

        :param path: the model's zip
        :param kwargs: the arguments of ``load``
        :return: the model's player; a line says whether it plays with the env's masks
        """
        if self.env is None:
            raise RuntimeError("The zoo's enjoy loaded the model before creating its env: cannot read the env's masks")
        player = MaskedPlayer(self.algorithm_class.load(path, **kwargs), self.env)
        if player.use_masking:
            print(f"Playing with the env's action masks ({self.algorithm_class.__name__})")
        else:
            print(f"The env has no action_masks() method: {self.algorithm_class.__name__} plays without masks")
        return player


@contextlib.contextmanager
def zoo_plays_with_masks() -> Iterator[None]:
    """
    Within the context, the zoo's ``enjoy`` plays the MaskablePPG algorithms of :data:`PPG_ALGORITHMS` with the
    masks of its env: ``rl_zoo3.enjoy.create_test_env`` hands the env it creates to a :class:`MaskedPlayerLoader`,
    which stands in ``ALGOS`` for the algorithm. Both are put back on leaving the context. Enter it after the zoo's
    registries are filled (:func:`sb3_ppg.cli.zoo.zoo_registered`).
    """
    from rl_zoo3.utils import ALGOS

    enjoy_module = importlib.import_module("rl_zoo3.enjoy")
    loaders = {
        name: MaskedPlayerLoader(algorithm) for name, algorithm in PPG_ALGORITHMS.items() if issubclass(algorithm, MaskablePPG)
    }
    saved_algorithms = {name: ALGOS.get(name) for name in loaders}
    create_test_env = enjoy_module.create_test_env  # type: ignore[attr-defined]

    def create_test_env_for_players(*args: Any, **kwargs: Any) -> VecEnv:
        env = create_test_env(*args, **kwargs)
        for loader in loaders.values():
            loader.env = env
        return env

    enjoy_module.create_test_env = create_test_env_for_players  # type: ignore[attr-defined]
    ALGOS.update(loaders)
    try:
        yield
    finally:
        enjoy_module.create_test_env = create_test_env  # type: ignore[attr-defined]
        for name, algorithm in saved_algorithms.items():
            if algorithm is None:
                ALGOS.pop(name, None)
            else:
                ALGOS[name] = algorithm
