"""Recurrent (LSTM) machinery: sequences with episode starts in one LSTM call, and the recurrent buffers."""

from sb3_ppg.common.recurrent.sequences import (
    LSTMStates,
    RNNStates,
    SequenceLayout,
    lstm_sequences,
    lstm_step,
    lstm_step_by_step,
    reset_states,
    sequence_layout,
)

__all__ = [
    "LSTMStates",
    "RNNStates",
    "SequenceLayout",
    "lstm_sequences",
    "lstm_step",
    "lstm_step_by_step",
    "reset_states",
    "sequence_layout",
]
