"""
A single-process stand-in for ``mpi4py``, written for the fidelity recordings (``record_reference.py``): the original
PPG code imports ``from mpi4py import MPI`` everywhere but, in one process, only needs the identity of each collective.
It is put on ``PYTHONPATH`` by the recording script; it is not part of ``sb3_ppg``.
"""
