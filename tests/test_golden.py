"""
Golden fixed-seed checksums: short CPU trainings whose final parameters must stay bit-identical.

Each case trains a few iterations (through at least one auxiliary phase) with a fixed seed on one torch thread and
hashes every parameter and optimizer-state tensor. A change that alters any of them fails here. When a change is
*meant* to alter the numbers, regenerate the file with ``SB3_PPG_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py``
and say in the commit (and CHANGELOG) which change altered them and why. Installs with numpy 2 (Python 3.13) compare
with their own file, ``golden_checksums_numpy2.json``: regenerate both (one run on each) when the numbers change.

float32 training is bit-reproducible on one machine, not across CPU makers: MKL's and oneDNN's kernels sum in a
different order on an Intel and an AMD CPU (the last bits differ after one update and more after a few). The files
therefore hold the checksums per CPU fingerprint (vendor, torch's CPU capability, AMX, torch's build), and a test
compares bit for bit where this machine's fingerprint has a record. On a CPU without one, it compares the sum of the
absolute parameter values with the recorded ones at a relative tolerance of 1e-3 (Intel and AMD differ by at most
6e-5 in these cases) and warns. ``SB3_PPG_UPDATE_GOLDEN=1`` on such a CPU adds its record (after that comparison);
on a CPU with a record whose checksum changed, it replaces the record and drops the other CPUs' records of the case,
stale then: those CPUs fall back to the tolerance until recorded again. (To change the numbers from a CPU without a
record, delete the case's records first.)
"""

import hashlib
import json
import os
import platform
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import FakeImageEnv, IdentityEnvMultiBinary, IdentityEnvMultiDiscrete

from sb3_ppg import PPG, make_procgen_env
from sb3_ppg.common.precision import cpu_has_amx

# numpy 2 changed how float32 arrays combine with Python floats (NEP 50), which changes classic-control physics such as
# Pendulum's in the last bits: numpy 2 installs (Python 3.13, procgen-gym) have checksums of their own
GOLDEN_FILE = (
    Path(__file__).parent
    / "data"
    / ("golden_checksums.json" if np.lib.NumpyVersion(np.__version__) < "2.0.0" else "golden_checksums_numpy2.json")
)
UPDATE = os.environ.get("SB3_PPG_UPDATE_GOLDEN") == "1"
# Where this machine has no record: how far the sum of absolute parameter values may be from the recorded machines'
CROSS_CPU_RTOL = 1e-3

# precision="fp32": the checksums are float32 training's on any CPU ("auto", the default, is bf16 for the CNN cases on
# a CPU with AMX; that is tested in test_ppg.py)
SMALL = dict(n_steps=16, n_policy_iters=2, n_aux_epochs=2, aux_batch_rollouts=1, seed=3, precision="fp32")


def _fake_images() -> FakeImageEnv:
    """16x16 RGB random images (the space is seeded: FakeImageEnv samples observations from it)."""
    env = FakeImageEnv(screen_height=16, screen_width=16, n_channels=3, discrete=True)
    env.observation_space.seed(7)
    return env


def _dict_cartpole(n_envs: int):
    from sb3_ppg.common.envs import make_dict_cartpole

    return make_vec_env(make_dict_cartpole, n_envs=n_envs, seed=5)


# name -> (policy, env builder, PPG kwargs, total timesteps)
CASES: dict[str, tuple[str, Any, dict[str, Any], int]] = {
    "dual_discrete": (
        "MlpPolicy",
        lambda: make_vec_env("CartPole-v1", n_envs=2, seed=5),
        dict(batch_size=8, policy_kwargs=dict(net_arch=[16])),
        128,
    ),
    "detach_box_value_epochs": (
        "MlpPolicy",
        lambda: make_vec_env("Pendulum-v1", n_envs=2, seed=5),
        dict(batch_size=16, n_epochs=1, n_value_epochs=2, policy_kwargs=dict(arch="detach", net_arch=[16])),
        128,
    ),
    "shared_discrete_kl_penalty": (
        "MlpPolicy",
        lambda: make_vec_env("CartPole-v1", n_envs=2, seed=5),
        dict(batch_size=16, clip_range=None, kl_coef=1.0, n_epochs=2, policy_kwargs=dict(arch="shared", net_arch=[16])),
        128,
    ),
    "dual_box_gsde_options": (
        "MlpPolicy",
        lambda: make_vec_env("Pendulum-v1", n_envs=2, seed=5),
        dict(
            batch_size=8,
            use_sde=True,
            clip_range_vf=0.2,
            max_grad_norm=0.5,
            normalize_advantage="minibatch",
            separate_aux_optimizer=False,
            n_aux_grad_accum=2,
            n_value_epochs=2,
            n_epochs=3,
            target_kl=0.05,
            policy_kwargs=dict(net_arch=dict(pi=[16], vf=[8])),
        ),
        128,
    ),
    "detach_multidiscrete_aux_trunk": (
        "MlpPolicy",
        lambda: make_vec_env(lambda: IdentityEnvMultiDiscrete(dim=3), n_envs=2, seed=5),
        dict(batch_size=16, policy_kwargs=dict(arch="detach", detach_value_in_aux=False, net_arch=[16])),
        128,
    ),
    "dual_multibinary": (
        "MlpPolicy",
        lambda: make_vec_env(lambda: IdentityEnvMultiBinary(dim=3), n_envs=2, seed=5),
        dict(batch_size=16, aux_learning_rate=1e-3, policy_kwargs=dict(net_arch=[16])),
        128,
    ),
    "dual_dict_obs": (
        "MultiInputPolicy",
        lambda: _dict_cartpole(2),
        dict(batch_size=16, policy_kwargs=dict(net_arch=[16])),
        128,
    ),
    "procgen_cnn_fake_images": (
        "ProcgenCnn",
        lambda: make_vec_env(_fake_images, n_envs=2, seed=5),
        dict(batch_size=16, n_steps=8),
        64,
    ),
    "procgen_cnn_starpilot": (
        "ProcgenCnn",
        lambda: make_procgen_env("starpilot", n_envs=2, seed=5, num_threads=1),
        dict(batch_size=16, n_steps=8, policy_kwargs=dict(arch="detach")),
        48,
    ),
}


def state_checksum(model: PPG) -> str:
    """sha256 over every policy parameter/buffer and every optimizer's state, in a fixed order."""
    digest = hashlib.sha256()

    def add(name: str, value: Any) -> None:
        digest.update(name.encode())
        if isinstance(value, th.Tensor):
            digest.update(value.detach().cpu().contiguous().numpy().tobytes())
        else:
            digest.update(repr(value).encode())

    for name, tensor in model.policy.state_dict().items():
        add(name, tensor)
    optimizers = {"policy": model.policy.optimizer}
    for name in ("aux_optimizer", "value_optimizer"):
        optimizer = getattr(model, name, None)
        if optimizer is not None:
            optimizers[name] = optimizer
    for opt_name, optimizer in optimizers.items():
        for index, state in sorted(optimizer.state_dict()["state"].items()):
            for key in sorted(state):
                add(f"{opt_name}.{index}.{key}", state[key])
    return digest.hexdigest()


def run_case(name: str) -> dict[str, Any]:
    policy, make_env, kwargs, total_timesteps = CASES[name]
    env = make_env()
    params = {**SMALL, **kwargs}
    model = PPG(policy, env, device="cpu", **params)
    model.learn(total_timesteps)
    env.close()
    assert model.n_aux_phases >= 1, f"{name} must reach an auxiliary phase"
    return {
        "checksum": state_checksum(model),
        "n_aux_phases": model.n_aux_phases,
        "param_abs_sum": float(sum(p.detach().abs().sum().item() for p in model.policy.parameters())),
    }


def cpu_fingerprint() -> str:
    """What decides float32 training's last bits on this machine: CPU vendor, torch's CPU capability, AMX, torch build."""
    vendor = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            vendor = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("vendor_id")), vendor)
    except OSError:
        pass
    amx = " AMX" if cpu_has_amx() else ""
    return f"{vendor} {th.backends.cpu.get_cpu_capability()}{amx} torch {th.__version__}"


@pytest.fixture(scope="module")
def golden() -> dict[str, dict[str, Any]]:
    """The golden file: CPU fingerprint -> case name -> record."""
    if GOLDEN_FILE.exists():
        return json.loads(GOLDEN_FILE.read_text())
    return {}


def compare_with_other_cpus(name: str, result: dict[str, Any], golden: dict[str, dict[str, Any]]) -> None:
    """The check on a CPU that has no record: the same aux phases and parameter sums within ``CROSS_CPU_RTOL``."""
    recorded = {fingerprint: records[name] for fingerprint, records in golden.items() if name in records}
    assert recorded, f"No golden checksum for {name}: run with SB3_PPG_UPDATE_GOLDEN=1 once and commit the file"
    for fingerprint, expected in recorded.items():
        assert result["n_aux_phases"] == expected["n_aux_phases"], f"{name}: aux phases differ from {fingerprint}'s"
        assert result["param_abs_sum"] == pytest.approx(expected["param_abs_sum"], rel=CROSS_CPU_RTOL), (
            f"{name}: parameters changed beyond the cross-CPU tolerance (abs sum {result['param_abs_sum']!r}, "
            f"{fingerprint}: {expected['param_abs_sum']!r})"
        )
    warnings.warn(
        f"{name}: no golden checksum for this CPU ({cpu_fingerprint()}): compared parameter sums at rtol "
        f"{CROSS_CPU_RTOL} with {sorted(recorded)}; record it with SB3_PPG_UPDATE_GOLDEN=1",
        stacklevel=2,
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_checksum(name: str, golden: dict[str, dict[str, Any]]) -> None:
    previous_threads = th.get_num_threads()
    th.set_num_threads(1)
    try:
        result = run_case(name)
    finally:
        th.set_num_threads(previous_threads)
    fingerprint = cpu_fingerprint()
    if UPDATE:
        previous = golden.get(fingerprint, {}).get(name)
        if previous is None and any(name in records for records in golden.values()):
            # Recording a new CPU, not a change of the numbers: it must agree with the others within the tolerance
            compare_with_other_cpus(name, result, golden)
        elif previous is not None and previous["checksum"] != result["checksum"]:
            # The numbers changed on purpose: the other CPUs' records are stale
            for records in golden.values():
                records.pop(name, None)
        golden.setdefault(fingerprint, {})[name] = result
        golden = {key: dict(sorted(records.items())) for key, records in sorted(golden.items()) if records}
        GOLDEN_FILE.parent.mkdir(exist_ok=True)
        GOLDEN_FILE.write_text(json.dumps(golden, indent=2) + "\n")
        return
    expected = golden.get(fingerprint, {}).get(name)
    if expected is None:
        compare_with_other_cpus(name, result, golden)
        return
    assert result["n_aux_phases"] == expected["n_aux_phases"]
    assert result["checksum"] == expected["checksum"], (
        f"{name}: parameters changed (abs sum {result['param_abs_sum']!r}, golden {expected['param_abs_sum']!r}). "
        "If the change is intended, regenerate with SB3_PPG_UPDATE_GOLDEN=1 and say why in the commit."
    )


def test_checksum_detects_one_bit() -> None:
    """The checksum changes when a single parameter moves by one ulp (the test can fail)."""
    model = PPG("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, n_aux_epochs=0, seed=0, device="cpu")
    before = state_checksum(model)
    with th.no_grad():
        param = next(model.policy.parameters())
        flat = param.view(-1)
        flat[0] = th.from_numpy(np.nextafter(flat[0:1].numpy(), np.float32(np.inf)))[0]
    assert state_checksum(model) != before


def test_cross_cpu_comparison_can_fail() -> None:
    """On a CPU without a record, a parameter sum beyond the tolerance or other aux phases fail (the fallback can fail)."""
    golden = {"Other CPU": {"case": {"checksum": "0", "n_aux_phases": 2, "param_abs_sum": 10.0}}}
    with pytest.warns(UserWarning, match="no golden checksum for this CPU"):
        compare_with_other_cpus("case", {"n_aux_phases": 2, "param_abs_sum": 10.0 * (1 + CROSS_CPU_RTOL / 2)}, golden)
    with pytest.raises(AssertionError, match="cross-CPU tolerance"):
        compare_with_other_cpus("case", {"n_aux_phases": 2, "param_abs_sum": 10.0 * (1 + 2 * CROSS_CPU_RTOL)}, golden)
    with pytest.raises(AssertionError, match="aux phases"):
        compare_with_other_cpus("case", {"n_aux_phases": 3, "param_abs_sum": 10.0}, golden)
    with pytest.raises(AssertionError, match="No golden checksum"):
        compare_with_other_cpus("unknown", {"n_aux_phases": 2, "param_abs_sum": 10.0}, golden)
