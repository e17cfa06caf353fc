"""
Run a trained PPG agent with the RL Baselines3 Zoo: ``python -m sb3_ppg.enjoy [zoo enjoy options]``
(console script ``sb3_ppg_enjoy``).

This is the zoo's own ``enjoy`` (``rl_zoo3.enjoy.enjoy()``) with PPG registered (see :mod:`sb3_ppg.cli.zoo`) and these
defaults:

- ``--algo ppg``;
- ``-f logs`` (where ``python -m sb3_ppg.train`` writes; the zoo's default, ``rl-trained-agents``, has no PPG agents);
- Procgen ids: sampled actions (``--stochastic``, pass ``--deterministic`` for greedy actions) and ``--no-render``
  (procgen only renders ``rgb_array`` frames); they run on the native vectorized env.

Example::

    python -m sb3_ppg.enjoy --env procgen/starpilot-v0 -f quickstart_output/logs -n 5000
    python -m sb3_ppg.enjoy --env CartPole-v1 --no-render --load-best
"""

import argparse
import sys

from sb3_ppg.cli.run_folders import UnsafeRunFileError
from sb3_ppg.cli.vec_env import is_procgen_env_id
from sb3_ppg.cli.zoo import run_zoo


def build_zoo_argv(argv: list[str]) -> list[str]:
    """
    The zoo's ``enjoy`` arguments: add ``--algo ppg``, ``-f logs`` and, for Procgen ids, ``--stochastic`` and
    ``--no-render``, unless given.

    :param argv: sb3_ppg's command line arguments
    :return: The zoo's command line arguments
    """
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--algo", default=None)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("-f", "--folder", default=None)
    parser.add_argument("--stochastic", action="store_true", default=False)
    parser.add_argument("--deterministic", action="store_true", default=False)
    parser.add_argument("--no-render", dest="no_render", action="store_true", default=False)
    known, _ = parser.parse_known_args(argv)

    zoo_argv = list(argv)
    if known.algo is None:
        zoo_argv += ["--algo", "ppg"]
    if known.folder is None:
        zoo_argv += ["-f", "logs"]
    if is_procgen_env_id(known.env):
        if not known.stochastic and not known.deterministic:
            zoo_argv.append("--stochastic")
        if not known.no_render:
            print("Procgen envs cannot render to a window: running with --no-render")
            zoo_argv.append("--no-render")
    return zoo_argv


def main(argv: list[str] | None = None) -> None:
    """
    Command line entry point (``python -m sb3_ppg.enjoy`` / ``sb3_ppg_enjoy``).

    A run folder's ``config.yml`` / ``args.yml`` are read without running code: a file holding a Python object other
    than what the zoo writes ends the command with a one-line error naming it. (The zoo still evaluates some
    hyperparameter strings as Python, e.g. ``normalize: "dict(...)"``: run only agents from folders you trust.)

    :param argv: Command line arguments (None: ``sys.argv[1:]``)
    """
    try:
        run_zoo("enjoy", build_zoo_argv(list(sys.argv[1:] if argv is None else argv)))
    except UnsafeRunFileError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
