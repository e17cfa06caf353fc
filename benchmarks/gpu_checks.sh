#!/usr/bin/env bash
# The checks that need a GPU, in one call on a lent GPU machine (docs/throughput.md, "Not measured yet"): the CUDA
# tests, then issue 27's unmeasured numbers (PPG's rollout buffer against SB3's, parallel_networks, the host's time
# per rollout with and without the rollout's host levers, a profile of the phases; CleanRL's script against sb3-ppg
# when STEPS names it), each step under its own time limit so that a slow one leaves the others' results. Everything
# is written to $OUT (the device tool's folder that comes back; ./gpu_checks_out elsewhere), with a summary line per
# step.
#
# From the checkout's root, after `bash ../shared/gpu-kit/make-kit.sh` built .gpu-kit/ there (carry .gpu-kit):
#   bash benchmarks/gpu_checks.sh            # about 9 minutes on an H100/H200-class GPU
# STEPS="throughput_ppg_buffer throughput_sb3_buffer" bash benchmarks/gpu_checks.sh runs only the steps named.
# The CUDA tests need pytest there; where the GPU image lacks it, add its wheels to the kit before carrying it:
#   pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .gpu-kit/whl pytest pluggy iniconfig packaging
set -uo pipefail
out="${OUT:-gpu_checks_out}"
mkdir -p "$out"
if [ -f .gpu-kit/setup.sh ]; then
    # shellcheck disable=SC1091
    source .gpu-kit/setup.sh > "$out/setup.log" 2>&1 || { echo "gpu-kit setup failed: $out/setup.log"; exit 1; }
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1; nproc; git log -1 --format=%H 2>&1; } \
    > "$out/machine.txt"

# wanted NAME: whether STEPS (when set) names the step
wanted() {
    [ -z "${STEPS:-}" ] || [[ " $STEPS " == *" $1 "* ]]
}

# step NAME SECONDS COMMAND...: run it unless STEPS leaves it out, its output in $OUT/NAME.log
step() {
    local name=$1 limit=$2
    shift 2
    wanted "$name" || return 0
    local start=$SECONDS
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    echo "$name: rc=$rc in $((SECONDS - start)) s (limit $limit s)" | tee -a "$out/summary.txt"
}

if wanted cuda_tests && ! python3 -c "import pytest" 2>/dev/null; then
    echo "cuda_tests: pytest is not installed (see the header)" | tee -a "$out/summary.txt"
fi
step cuda_tests 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_exactness.py tests/test_cuda_graphs.py \
    tests/test_parallel_networks.py tests/test_rollout_buffers.py tests/test_finite_check.py tests/test_aux_buffer_device.py

# The GPU section's configuration (dual, bf16, 64 envs x 256 steps, N_pi 8, E_aux 6): one lever changed at a time
config=(--device cuda --arch dual --n-envs 64 --n-steps 256 --n-policy-iters 8 --n-aux-epochs 6 --precision bf16
    --modes optimized --bound-repeats 1 --env-limit-steps 50)
for variant in ppg_buffer sb3_buffer parallel_networks; do
    case $variant in
        ppg_buffer) extra=(--rollout-buffer ppg) ;;
        sb3_buffer) extra=(--rollout-buffer sb3) ;;
        parallel_networks) extra=(--rollout-buffer ppg --parallel-networks) ;;
    esac
    step "throughput_$variant" 120 python3 benchmarks/throughput.py "${config[@]}" "${extra[@]}" \
        --output "$out/throughput_$variant.md" --json "$out/throughput_$variant.json"
done

step rollout_host_time 60 python3 benchmarks/rollout_host_time.py --device cuda --n-envs 64 --n-steps 256 --rounds 5 \
    --json "$out/rollout_host_time.json"

# Issue 27's comparison with CleanRL's own script (detach, sb3-ppg in bf16, 3 cycles: whole processes and the last
# cycle's rates), about 4 minutes: only when STEPS names vs_cleanrl (the default steps take about 9 of the 10 minutes
# one device call may run), e.g. STEPS="vs_cleanrl profile_phases". It needs CleanRL's script in the kit,
# `git -C /path/to/cleanrl show HEAD:cleanrl/ppg_procgen.py > .gpu-kit/ppg_procgen.py` (or CLEANRL_SCRIPT), and its
# imports: gym 0.23.1 and tyro are in the kit; add tensorboard's wheels where the image lacks it.
cleanrl_script="${CLEANRL_SCRIPT:-.gpu-kit/ppg_procgen.py}"
if [ -n "${STEPS:-}" ] && wanted vs_cleanrl; then
    if [ ! -f "$cleanrl_script" ]; then
        echo "vs_cleanrl: no CleanRL script at $cleanrl_script (see above)" | tee -a "$out/summary.txt"
    elif ! python3 -c "import gym, tyro, procgen, torch.utils.tensorboard" > "$out/vs_cleanrl_imports.log" 2>&1; then
        echo "vs_cleanrl: CleanRL's imports fail here: $out/vs_cleanrl_imports.log" | tee -a "$out/summary.txt"
    else
        step vs_cleanrl 300 python3 benchmarks/vs_cleanrl.py --cleanrl-script "$cleanrl_script" --device cuda \
            --arch detach --precision bf16 --n-envs 64 --n-steps 256 --n-policy-iters 8 --n-aux-epochs 6 --n-cycles 3 \
            --json "$out/vs_cleanrl.json"
    fi
fi

# Where each phase's time goes now (device busy share, kernels, host syncs): last, the first step to leave out when
# the device time left is short
step profile_phases 90 python3 benchmarks/profile_phases.py --device cuda --arch dual --n-envs 64 --n-steps 256 \
    --n-policy-iters 2 --n-aux-epochs 1 --precision bf16
