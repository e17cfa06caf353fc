"""
What the last ``train()`` of a ``learn()`` records: SB3's ``learn()`` writes its table before each ``train()``, so the
last one's values (its ``train/*`` and, when it ran an auxiliary phase, ``aux/*``) would never be written.
"""

from typing import Any

from stable_baselines3.common.logger import DISABLED, KVWriter, Logger


def write_pending_values(logger: Logger, step: int) -> dict[str, Any]:
    """
    Write the values recorded since the last dump to the logger's outputs, keeping them in ``logger.name_to_value``
    (where code reads the last values after ``learn()``).

    :param logger: the model's logger
    :param step: the step they are written at (the model's ``num_timesteps``)
    :return: the values written, by key (for :func:`drop_written_values`)
    """
    if logger.level == DISABLED or not logger.name_to_value:
        return {}
    # With the step, as SB3's tables have it (a CSV row then says which step its values belong to)
    values = {**logger.name_to_value, "time/total_timesteps": step}
    excluded = {**logger.name_to_excluded, "time/total_timesteps": logger.to_tuple(None)}
    for output in logger.output_formats:
        if isinstance(output, KVWriter):
            output.write(values, excluded, step)
    return dict(logger.name_to_value)


def drop_written_values(logger: Logger, written: dict[str, Any]) -> None:
    """
    Forget the values :func:`write_pending_values` wrote that are still pending, so that the next dump does not write
    them a second time (values recorded since stay).

    :param logger: the model's logger
    :param written: what :func:`write_pending_values` returned
    """
    for key, value in written.items():
        if key in logger.name_to_value and logger.name_to_value[key] is value:
            del logger.name_to_value[key]
            logger.name_to_count.pop(key, None)
            logger.name_to_excluded.pop(key, None)
