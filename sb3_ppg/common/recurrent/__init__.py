"""Recurrent (LSTM) machinery: sequences with episode starts in one LSTM call, and the recurrent buffers."""

from sb3_ppg.common.recurrent.sequences import (
    LSTMStates,
    RNNStates,
    lstm_sequences,
    lstm_step,
    lstm_step_by_step,
    reset_states,
)

__all__ = ["LSTMStates", "RNNStates", "lstm_sequences", "lstm_step", "lstm_step_by_step", "reset_states"]
