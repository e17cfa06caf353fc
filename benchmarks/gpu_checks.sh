#!/usr/bin/env bash
# The checks that need a GPU, in one or two calls on a lent GPU machine (docs/throughput.md, "Not measured yet"): the
# headline throughput (the defaults), CleanRL's script against sb3-ppg (when the kit holds it), the CUDA tests, then
# detach, torch.compile of the features extractors (detach and dual), one lever at a time (the rollout buffer written
# after the envs step, SB3's rollout buffer, parallel_networks off), 256 envs, the rollout's host time, a profile of
# the phases, detach's A/B of the rollout buffer's writes and dual's again, in that order of priority; then issue 27's
# "done when" against what they measured. Each step runs under its own time limit so that a slow one leaves the
# others' results.
#
# Logs go to $LOGS (default ./gpu_checks_out, git-ignored), one per step plus summary.txt; a step already in its
# summary.txt with rc=0 is not run again, so a second call on the same warm machine goes on where the first stopped.
# DEADLINE_S (seconds) leaves out the steps that would not end in time. Where $OUT is set (the device tool's folder
# that comes back, at most 8 files), the logs also go there as one gpu_checks.tgz, refreshed after every step.
#
# From the checkout's root, after `bash ../shared/gpu-kit/make-kit.sh` built .gpu-kit/ there (carry .gpu-kit):
#   DEADLINE_S=555 bash benchmarks/gpu_checks.sh     # 9 of its then 11 steps took 7.9 minutes on an H100
#                                                    # (2026-11-27), a throughput step about 40 s; 15 steps now
# STEPS="throughput_defaults throughput_sb3_buffer" bash benchmarks/gpu_checks.sh runs only the steps named.
# The vs_cleanrl step needs CleanRL's script in the kit,
#   git -C /path/to/cleanrl show HEAD:cleanrl/ppg_procgen.py > .gpu-kit/ppg_procgen.py   (or CLEANRL_SCRIPT=PATH)
# and its imports (gym 0.23.1 and tyro are in the kit; tensorboard and pytest are in the GPU image; where an image
# lacks them: pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .gpu-kit/whl NAME...).
set -uo pipefail
logs="${LOGS:-gpu_checks_out}"
deadline="${DEADLINE_S:-100000}"
mkdir -p "$logs"
if [ -f .gpu-kit/setup.sh ]; then
    # shellcheck disable=SC1091
    source .gpu-kit/setup.sh > "$logs/setup.log" 2>&1 || { echo "gpu-kit setup failed: $logs/setup.log"; exit 1; }
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1; nproc; git log -1 --format=%H 2>&1; } \
    > "$logs/machine.txt"

# bundle: the logs as one file in $OUT (where it is set)
bundle() {
    if [ -n "${OUT:-}" ]; then
        mkdir -p "$OUT" && tar -czf "$OUT/gpu_checks.tgz.part" -C "$logs" . \
            && mv "$OUT/gpu_checks.tgz.part" "$OUT/gpu_checks.tgz"
    fi
}

# wanted NAME: whether STEPS (when set) names the step
wanted() {
    [ -z "${STEPS:-}" ] || [[ " $STEPS " == *" $1 "* ]]
}

# passed NAME: whether the step passed in an earlier call (its summary line says rc=0)
passed() {
    grep -q "^$1: rc=0 " "$logs/summary.txt" 2>/dev/null
}

# note LINE: a line of the summary
note() {
    echo "$1" | tee -a "$logs/summary.txt"
}

# step NAME SECONDS COMMAND...: run it unless STEPS leaves it out, it already passed, or the deadline is too near
step() {
    local name=$1 limit=$2
    shift 2
    wanted "$name" && ! passed "$name" || return 0
    if [ $((deadline - SECONDS)) -lt "$limit" ]; then
        note "$name: left out ($((deadline - SECONDS)) s to the deadline, limit $limit s)"
        return 0
    fi
    local start=$SECONDS
    timeout "$limit" "$@" > "$logs/$name.log" 2>&1
    local rc=$?
    note "$name: rc=$rc in $((SECONDS - start)) s (limit $limit s)"
    bundle
}

# The GPU section's configuration (dual, bf16, 64 envs x 256 steps, N_pi 8, E_aux 6): one lever changed at a time
config=(--device cuda --arch dual --n-envs 64 --n-steps 256 --n-policy-iters 8 --n-aux-epochs 6 --precision bf16
    --modes optimized --bound-repeats 1 --env-limit-steps 50)

# throughput VARIANT LIMIT EXTRA...: throughput.py at the configuration above, one option changed
throughput() {
    local variant=$1 limit=$2
    shift 2
    step "throughput_$variant" "$limit" python3 benchmarks/throughput.py "${config[@]}" "$@" \
        --output "$logs/throughput_$variant.md" --json "$logs/throughput_$variant.json"
}

throughput defaults 120

# Issue 27's comparison with CleanRL's own script (detach, sb3-ppg in bf16, 2 cycles: whole processes and the last
# cycle's rates), about 2 minutes
cleanrl_script="${CLEANRL_SCRIPT:-.gpu-kit/ppg_procgen.py}"
if wanted vs_cleanrl && ! passed vs_cleanrl; then
    if [ ! -f "$cleanrl_script" ]; then
        note "vs_cleanrl: no CleanRL script at $cleanrl_script (see above)"
    elif ! python3 -c "import gym, tyro, procgen, torch.utils.tensorboard" > "$logs/vs_cleanrl_imports.log" 2>&1; then
        note "vs_cleanrl: CleanRL's imports fail here: $logs/vs_cleanrl_imports.log"
    else
        step vs_cleanrl 240 python3 benchmarks/vs_cleanrl.py --cleanrl-script "$cleanrl_script" --device cuda \
            --arch detach --precision bf16 --n-envs 64 --n-steps 256 --n-policy-iters 8 --n-aux-epochs 6 --n-cycles 2 \
            --json "$logs/vs_cleanrl.json"
    fi
fi

if wanted cuda_tests && ! python3 -c "import pytest" 2>/dev/null; then
    note "cuda_tests: pytest is not installed (see the header)"
fi
# In one process (--numprocesses=0: pytest-xdist's workers would share the GPU; without xdist the option is ignored)
step cuda_tests 150 python3 -m pytest -q -p no:cacheprovider --numprocesses=0 tests/test_cuda_exactness.py \
    tests/test_cuda_graphs.py tests/test_parallel_networks.py tests/test_rollout_buffers.py tests/test_finite_check.py \
    tests/test_aux_buffer_device.py

throughput detach 120 --arch detach
# torch.compile of the features extractors (an option of the benchmark, not of PPG: inductor's kernels round
# differently from the eager ones), static shapes, warmed up over a whole N_pi cycle so that no compilation is timed:
# not measured end to end yet, hence before the levers measured once already
throughput detach_compile 300 --arch detach --compile
throughput compile 360 --compile

throughput sb3_buffer 120 --rollout-buffer sb3
throughput no_parallel_networks 120 --no-parallel-networks
throughput 256_envs 150 --n-envs 256 --n-policy-iters 4

step rollout_host_time 60 python3 benchmarks/rollout_host_time.py --device cuda --n-envs 64 --n-steps 256 --rounds 5 \
    --json "$logs/rollout_host_time.json"

# Where each phase's time goes now (device busy share, kernels, host syncs)
step profile_phases 90 python3 benchmarks/profile_phases.py --device cuda --arch dual --n-envs 64 --n-steps 256 \
    --n-policy-iters 2 --n-aux-epochs 1 --precision bf16

throughput defaults_repeat 120

# Issue 27's "done when" against what the steps above measured (those that ran), as the summary's last lines
if [ -f "$logs/throughput_defaults.json" ] || [ -f "$logs/vs_cleanrl.json" ]; then
    python3 - "$logs" <<'PYTHON' | tee -a "$logs/summary.txt"
import json
import os
import sys

logs = sys.argv[1]


def rate(name):
    path = os.path.join(logs, f"throughput_{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as file:
        return json.load(file)[0]["end_to_end_env_steps_per_s"]


compiled = "with --compile (not the eager updates)"
for name, what in (
    ("defaults", "dual bf16, 64 envs"),
    ("256_envs", "dual bf16, 256 envs"),
    ("detach", "detach bf16, 64 envs"),
    ("compile", f"dual bf16, 64 envs, {compiled}"),
    ("detach_compile", f"detach bf16, 64 envs, {compiled}"),
):
    value = rate(name)
    if value is not None:
        verdict = "met" if value >= 10_000 else "not met"
        print(f"issue 27: {what}: {value:,.0f} env steps/s end to end (target >= 10,000: {verdict})")
path = os.path.join(logs, "vs_cleanrl.json")
if os.path.exists(path):
    with open(path) as file:
        results = json.load(file)
    cycle = results.get("cycle_ratio")
    cycle_text = f", last cycle {cycle:.2f}x" if cycle is not None else ""
    verdict = "met" if results["ratio"] >= 3 else "not met"
    print(f"issue 27: sb3-ppg / CleanRL {results['ratio']:.2f}x whole process{cycle_text} (target >= 3x: {verdict})")
PYTHON
fi
bundle
