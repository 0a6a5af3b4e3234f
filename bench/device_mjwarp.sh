#!/usr/bin/env bash
# MuJoCo Warp on the GPU test machine (issue 28): BatchCheetah's MJWarp backend tested
# on CUDA and benchmarked at 8,192 worlds against the C engine on every CPU core.
#
# warp-lang does not fit one device run's 64 MiB, so it travels in parts
# (bench/fetch_device_wheels.sh --warp, run here first) over consecutive runs of this
# same command, in quick succession (git-ignored folders stay on the machine between
# them; docs/batch_device.md):
#
#   run 1: carry build/wheels build/warp/SHA256SUMS build/warp/part-00
#   run 2: carry build/warp/part-01          (and so on, if there are more parts)
#
# Each run installs the wheels into build/device-site and checks the parts that have
# arrived (sha256); while some are missing it names them and exits 0. Once all are
# there it unpacks Warp's GPU part into build/device-site, runs the MJWarp tests on CUDA
# (tests/test_batch_mjwarp.py -k cuda, the 1,000-step agreement with MuJoCo C included)
# and bench/bench_mjwarp.py (8,192 worlds), within 9 minutes; report in
# $OUT/device_mjwarp.md.
#
#   bench/device_mjwarp.sh          # on the GPU machine
#   bench/device_mjwarp.sh --cpu    # dry run here: the .venv's MuJoCo Warp on Warp's
#                                   # CPU backend, tests collected, a tiny bench
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/_device_common.sh
source bench/_device_common.sh # device_mode, say, device_header, step, install_wheels
device_mode bench/device_mjwarp.sh "$@"

out=${OUT:-build/device-check}
mkdir -p "$out"
report=$out/device_mjwarp.md
start=$(date +%s)
deadline=530
step_log=$out/step.log
step_tail=60
export PYTHONUNBUFFERED=1

device_header "simkit MuJoCo Warp check"

if [ "$mode" = gpu ]; then
    PY=python3
    site=$PWD/build/device-site
    mkdir -p "$site"
    shopt -s nullglob
    wheels=(build/wheels/*.whl)
    if [ ${#wheels[@]} -eq 0 ] || [ ! -f build/warp/SHA256SUMS ]; then
        say "" "missing build/wheels or build/warp/SHA256SUMS: run bench/fetch_device_wheels.sh --warp" \
            "here and carry build/wheels build/warp/SHA256SUMS build/warp/part-00"
        echo "missing build/wheels or build/warp/SHA256SUMS" >&2
        exit 2
    fi
    install_wheels "$site" "${wheels[@]}"
    missing=()
    while read -r sum name; do
        if ! echo "$sum  build/warp/$name" | sha256sum -c --quiet - >/dev/null 2>&1; then
            missing+=("$name")
        fi
    done <build/warp/SHA256SUMS
    if [ ${#missing[@]} -gt 0 ]; then
        say "" "warp-lang parts still to carry: ${missing[*]}: run this again at once," \
            "carrying build/warp/${missing[0]}"
        echo "report: $report (parts missing: ${missing[*]})"
        exit 0
    fi
    # shellcheck disable=SC2046
    step "unpack warp-lang's GPU part" 120 bash -c \
        "cat $(awk '{print "build/warp/" $2}' build/warp/SHA256SUMS | tr '\n' ' ') | xz -dc | tar -x -C $site" ||
        exit 1
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    export WARP_CACHE_PATH=$PWD/build/warp-cache # compiled kernels kept between runs
    bench_args=()
    tests=(-k cuda)
else
    PY=.venv/bin/python
    bench_args=(--device cpu --quick --no-cpu)
    tests=(--collect-only -k cuda)
fi
say "- $($PY -c 'import torch, warp, mujoco_warp; print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}, warp {warp.__version__}, mujoco_warp {mujoco_warp.__version__}")' 2>&1 | tail -1)"

step "MuJoCo Warp tests (${tests[*]})" 240 $PY -m pytest -q -p no:cacheprovider -rs \
    "${tests[@]}" tests/test_batch_mjwarp.py
left=$((deadline - ($(date +%s) - start)))
if [ "$left" -ge 60 ]; then
    say "" "## bench/bench_mjwarp.py ${bench_args[*]}" ""
    timeout -k 10 "$left" $PY bench/bench_mjwarp.py "${bench_args[@]}" >>"$report" 2>"$out/bench.err"
    rc=$?
    [ $rc -ne 0 ] && say "" "bench_mjwarp.py: exit $rc" '```' "$(tail -n 20 "$out/bench.err")" '```'
else
    say "" "bench/bench_mjwarp.py not run: $left s left"
fi
say "" "total: $(($(date +%s) - start)) s"
echo "report: $report"
