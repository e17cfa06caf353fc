"""
``mpi4py.MPI`` for one process: ``COMM_WORLD`` of size 1 whose collectives return (or copy) the caller's own data.

Only what openai/phasic-policy-gradient calls is implemented: ``Get_rank`` / ``Get_size`` / ``rank`` / ``size``,
``allgather``, ``gather``, ``bcast``, ``Bcast``, ``Allreduce``, ``allreduce``, ``Barrier`` and ``Split``; the type
``Comm`` (used in annotations) and ``SUM``.
"""

import numpy as np

SUM = "sum"


class Comm:
    """A communicator of one process: every collective is the identity."""

    rank = 0
    size = 1

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 1

    def allgather(self, value):
        return [value]

    def gather(self, value, root: int = 0):
        return [value]

    def bcast(self, value, root: int = 0):
        return value

    def allreduce(self, value, op=SUM):
        return value

    def Bcast(self, buffer, root: int = 0) -> None:
        """In place: the buffer already holds rank 0's data."""

    def Allreduce(self, send, receive, op=SUM) -> None:
        np.copyto(receive, send)

    def Barrier(self) -> None:
        """Nothing to wait for."""

    def Split(self, color: int = 0, key: int = 0) -> "Comm":
        return Comm()


COMM_WORLD = Comm()
