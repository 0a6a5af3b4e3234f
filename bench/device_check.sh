#!/usr/bin/env bash
# The prepared GPU check (issue 26): one command for a session that is lent the GPU
# test machine, at most 8 minutes there, markdown to one file. It
#   1. installs the wheels the machine's image lacks from build/wheels (fetched here,
#      beforehand, by bench/fetch_device_wheels.sh; the device tool's `carry` brings them)
#      into a target folder on PYTHONPATH, and the project editable (docs/benchmarks.md);
#   2. runs the CUDA tests (the tests that skip without CUDA, selected by "cuda" in their
#      names, in the files that check torch.cuda.is_available());
#   3. runs issue 27's GPU main job (simkit train simkit/BatchCartPole-v0 --device cuda
#      --device-loop on, 4096 envs, 3 seeds: seconds to a mean return of 475, steps/s) and
#      bench/gpu_check.py (GPU and CPU of the same machine, same run);
#   3b. runs --device auto's probe over a sweep of sizes (bench/bench_device_pick.py: the
#      update step's ms on the CPU and on CUDA, and what auto picks: where the GPU pays);
#   4. trains once per learner with --device cuda and with --device cpu: PPO on
#      simkit/Cheetah-v0 (64 envs x 64 steps, in process) and SAC on gym:Pendulum-v1,
#      and tabulates each run's steps/s, wall time and time split.
# Each step has its own time limit, cut so that every step ends within 460 s, a kill's
# grace included (gpu_check leaves the trainings 2 minutes; a step that cannot start
# says so), so the report comes back well inside 8 minutes; a step that fails is
# reported and the rest go on.
#
#   bench/device_check.sh          # on the GPU machine (report: $OUT/device_check.md)
#   bench/device_check.sh --cpu    # dry run here: the project's .venv, no install, no
#                                  # CUDA runs, tiny sizes (report: build/device-check/)
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/_device_common.sh
source bench/_device_common.sh # device_mode, say, device_header, step, install_wheels
device_mode bench/device_check.sh "$@"

out=${OUT:-build/device-check}
mkdir -p "$out"
report=$out/device_check.md
work=$(mktemp -d)
start=$(date +%s)
deadline=450 # seconds: every step ends by then, 10 s of grace to kill (limits cut to fit)
step_log=$work/last.log # the last step's output: row reads its summary
step_tail=40
export PYTHONUNBUFFERED=1

device_header "simkit device check"

if [ "$mode" = gpu ]; then
    PY=python3
    site=/tmp/simkit-site
    shopt -s nullglob
    wheels=(build/wheels/*.whl)
    if [ ${#wheels[@]} -eq 0 ]; then
        say "" "no wheels in build/wheels: run bench/fetch_device_wheels.sh here and carry build/wheels"
        echo "no wheels in build/wheels" >&2
        exit 2
    fi
    install_wheels "$site" "${wheels[@]}"
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    devices=(cuda cpu)
    ppo_steps=65536
    sac_steps=3000
    sac_starts=1000
    check_args=()
else
    PY=.venv/bin/python
    devices=(cpu)
    ppo_steps=4096
    sac_steps=300
    sac_starts=200
    check_args=(--quick --only ppo --only loop --repeats 1)
fi
say "- $($PY -c 'import sys, torch; print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, available: {torch.cuda.is_available()}")' 2>&1)"

cuda_tests=$(grep -l "torch.cuda.is_available" tests/test_*.py | tr '\n' ' ')
if [ "$mode" = gpu ]; then
    # shellcheck disable=SC2086
    step "CUDA tests" 150 $PY -m pytest -q -p no:cacheprovider -rs -k cuda $cuda_tests
else
    # shellcheck disable=SC2086
    step "CUDA tests (collected only: no CUDA here)" 60 $PY -m pytest -q -p no:cacheprovider --collect-only -k cuda $cuda_tests
fi

# Issue 27's GPU main job: simkit train simkit/BatchCartPole-v0 with the whole loop on
# the device (--device-loop on), one run per seed: the training seconds to a mean return
# of 475 and the env steps/s then (bench/bench_device_loop.py --main-job).
if [ "$mode" = gpu ]; then
    main_args=(--device cuda --num-envs 4096 --num-steps 16 --learning-rate 5e-4
        --total-steps 4000000 --seeds 1 2 3)
else
    main_args=(--device cpu --num-envs 64 --num-steps 16 --total-steps 4096 --seeds 1 --target 20)
fi
step "main job on the device: bench/bench_device_loop.py --main-job ${main_args[*]}" 150 \
    $PY bench/bench_device_loop.py --main-job "${main_args[@]}"

# --device auto's probe over batch and model sizes: where the GPU pays for the update.
if [ "$mode" = gpu ]; then pick_args=(); else pick_args=(--quick); fi
step "--device auto's probe: bench/bench_device_pick.py ${pick_args[*]}" 45 \
    $PY bench/bench_device_pick.py "${pick_args[@]}"

left=$((deadline - 120 - ($(date +%s) - start))) # the trainings keep 2 minutes
if [ "$left" -ge 30 ]; then
    [ "$left" -gt 250 ] && left=250
    say "" "## bench/gpu_check.py ${check_args[*]}" ""
    timeout -k 10 "$left" $PY bench/gpu_check.py "${check_args[@]}" >>"$report" 2>"$work/gpu_check.err"
    rc=$?
    [ $rc -ne 0 ] && say "" "gpu_check.py: exit $rc" '```' "$(tail -n 20 "$work/gpu_check.err")" '```'
fi

say "" "## Training, --device cuda vs --device cpu" ""
rows=()
# row LABEL DEVICE: the table row of the last training step's summary.
row() {
    local log=$step_log
    rows+=("| $1 | $2 | $(grep -m1 'steps/s:' "$log" | sed 's/.*: //') | $(grep -m1 'wall time:' "$log" | sed 's/.*: //') | $(grep -m1 'time split:' "$log" | sed 's/.*split: //') |")
}
# Each learner on every device in turn, so a run cut short still pairs its devices.
for dev in "${devices[@]}"; do
    step "PPO simkit/Cheetah-v0 --device $dev" 90 $PY -m simkit train simkit/Cheetah-v0 \
        --num-envs 64 --num-steps 64 --servers 0 --total-steps $ppo_steps --device "$dev" \
        --logdir "$work/ppo-$dev" --no-progress
    row "PPO simkit/Cheetah-v0, 64 envs x 64 steps, $ppo_steps steps" "$dev"
done
for dev in "${devices[@]}"; do
    step "SAC gym:Pendulum-v1 --device $dev" 90 $PY -m simkit train gym:Pendulum-v1 --algo sac \
        --total-steps $sac_steps --learning-starts $sac_starts --device "$dev" \
        --logdir "$work/sac-$dev" --no-progress
    row "SAC gym:Pendulum-v1, $sac_steps steps ($sac_starts random)" "$dev"
done
say "" "| run | device | steps/s | wall time | time split |" "|---|---|---:|---:|---|"
for row in "${rows[@]}"; do say "$row"; done

say "" "total: $(($(date +%s) - start)) s"
rm -rf "$work"
echo "report: $report"
