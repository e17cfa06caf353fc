"""
Writes tests/data/old_files/recurrent/ (read by tests/test_recurrent_buffers.py): a RecurrentPPG checkpoint with two
policy iterations in its auxiliary buffer and that buffer saved by ``save_aux_buffer``. The committed files were
written by the code of commit e166e31 (the auxiliary buffer's episode starts and start states in NumPy arrays):

    git archive e166e31 | tar -x -C /tmp/e166e31
    cd /tmp/e166e31 && PYTHONPATH=$PWD python <this repository>/tests/data/scripts/write_recurrent_old_files.py \
        <this repository>/tests/data/old_files/recurrent
"""

import pathlib
import shutil
import sys

from stable_baselines3.common.env_util import make_vec_env

from sb3_ppg import PPGCheckpointCallback, RecurrentPPG

folder = pathlib.Path(sys.argv[1])
shutil.rmtree(folder, ignore_errors=True)
env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
model = RecurrentPPG(
    "MlpLstmPolicy",
    env,
    n_steps=8,
    batch_size=8,
    n_policy_iters=3,
    n_aux_epochs=1,
    aux_batch_rollouts=2,
    policy_kwargs=dict(lstm_hidden_size=4, net_arch=[4]),
    seed=0,
    device="cpu",
)
# An auxiliary phase after 3 iterations, then 2 more in the buffer: the checkpoint at step 80 (40 env.step() calls)
model.learn(80, callback=PPGCheckpointCallback(40, str(folder / "checkpoints"), name_prefix="rppg", keep_last=1))
assert model.n_aux_phases == 1 and model.aux_buffer.n_iterations == 2
model.save_aux_buffer(folder / "aux_buffer.npz")
(folder / "checkpoints" / ".sb3_ppg.lock").unlink(missing_ok=True)  # the released lock of the run
