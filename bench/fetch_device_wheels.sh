#!/usr/bin/env bash
# Downloads, on a machine with network access, the wheels that the GPU test machine's
# image lacks (docs/benchmarks.md, "GPU check"), for Python 3.12 on manylinux x86_64,
# into build/wheels/ (git-ignored; bench/device_check.sh installs them there). The
# versions are the ones this project's CI resolves; the GPU image already has torch,
# numpy, msgpack, rich, safetensors, prometheus_client, tensorboard, threadpoolctl,
# hypothesis and pytest.
#
#   bench/fetch_device_wheels.sh [DEST]     # DEST defaults to build/wheels
#   bench/fetch_device_wheels.sh --warp     # also MuJoCo Warp's GPU part in build/warp/
#
# --warp (issue 28, bench/device_mjwarp.sh): warp-lang has no wheel that fits one run's
# 64 MiB (1.18.0, the smallest that mujoco-warp 4.0 accepts, is 149 MB: 1.15-1.17 are
# larger). What a GPU needs of it is the Python package and bin/warp.so (CUDA kernels,
# NVRTC); bin/warp-clang.so is Warp's CPU backend, and tests/ and examples/ are not
# used. Those parts, tar'd and xz'd (~74 MiB), are split into build/warp/part-00 (small
# enough to travel beside build/wheels and build/warp/SHA256SUMS) and part-01 (the rest):
# two device runs in quick succession carry them (docs/batch_device.md).
set -euo pipefail
cd "$(dirname "$0")/.."

warp=0
if [ "${1:-}" = "--warp" ]; then
    warp=1
    shift
fi
dest=${1:-build/wheels}
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=${PYTHON:-.venv/bin/python}

# name==version: gymnasium and pettingzoo with their pure-Python needs, MuJoCo 4 (a small
# wheel over mujoco-core and mujoco-studio), the wire's pyzmq, and the recorders' codecs.
wheels=(
    gymnasium==1.4.0
    farama-notifications==0.0.6
    cloudpickle==3.1.3
    pettingzoo==1.27.0
    mujoco==4.0.0
    mujoco-core==4.0.0
    mujoco-studio==4.0.0
    glfw==2.11.0
    pyopengl==3.1.10
    websockets==17.4
    pyzmq==27.3.0
    zstandard==0.25.0
    zlib-ng==1.1.0
    mujoco-warp==4.0.0
)

mkdir -p "$dest"
for spec in "${wheels[@]}"; do
    name=${spec%%==*}
    # Skip a wheel already there (a rerun downloads nothing new).
    pattern=$(echo "$name" | tr '-' '_' | tr '[:upper:]' '[:lower:]')
    if ls "$dest" 2>/dev/null | tr '[:upper:]' '[:lower:]' | grep -q "^${pattern}-${spec##*==}-"; then
        continue
    fi
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$dest" "$spec"
done

count=$(ls "$dest"/*.whl | wc -l)
bytes=$(cat "$dest"/*.whl | wc -c)
echo "$count wheels in $dest, $((bytes / 1024 / 1024)) MiB"
if [ "$bytes" -ge $((56 * 1024 * 1024)) ]; then
    echo "warning: the wheels take $((bytes / 1024 / 1024)) MiB of the 64 MiB a device run carries" >&2
fi

[ "$warp" = 1 ] || exit 0
# MuJoCo Warp's GPU part of warp-lang, in two parts (see the top of this file).
WARP_VERSION=1.18.0
out=build/warp
if [ -f "$out/SHA256SUMS" ] && [ "$(cat "$out/VERSION" 2>/dev/null)" = "$WARP_VERSION" ] &&
    (cd "$out" && sha256sum -c --quiet SHA256SUMS); then
    echo "warp $WARP_VERSION parts already in $out"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 -d "$tmp" "warp-lang==$WARP_VERSION"
mkdir -p "$tmp/x" "$out"
(cd "$tmp/x" && unzip -q "$tmp"/warp_lang-*.whl)
rm -rf "$tmp/x/warp/bin/warp-clang.so" "$tmp/x/warp/tests" "$tmp/x/warp/examples"
tar -C "$tmp/x" -cf - warp "warp_lang-$WARP_VERSION.dist-info" | xz -9 -T0 >"$tmp/warp.tar.xz"
rm -f "$out"/part-* "$out/SHA256SUMS" "$out/VERSION"
# part-00 travels with build/wheels: together at most 58 MiB of the run's 64 MiB.
first=$(((58 * 1024 * 1024) - bytes))
head -c "$first" "$tmp/warp.tar.xz" >"$out/part-00"
# The rest in parts of at most 60 MiB, one device run each (part-01, part-02, ...).
tail -c +$((first + 1)) "$tmp/warp.tar.xz" | split -b 60M -d -a 2 --numeric-suffixes=1 - "$out/part-"
(cd "$out" && sha256sum part-*) >"$out/SHA256SUMS" # the parts in order: cat them, then xz -d
echo "$WARP_VERSION" >"$out/VERSION"
for part in "$out"/part-*[0-9]; do
    echo "$part: $(($(wc -c <"$part") / 1024 / 1024)) MiB"
done
