#!/usr/bin/env bash
# Downloads, on a machine with network access, the wheels that the GPU test machine's
# image lacks (docs/benchmarks.md, "GPU check"), for Python 3.12 on manylinux x86_64,
# into build/wheels/ (git-ignored; bench/device_check.sh installs them there). The
# versions are the ones this project's CI resolves; the GPU image already has torch,
# numpy, msgpack, rich, safetensors, prometheus_client, tensorboard, threadpoolctl,
# hypothesis and pytest.
#
#   bench/fetch_device_wheels.sh [DEST]     # DEST defaults to build/wheels
set -euo pipefail
cd "$(dirname "$0")/.."

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
