"""MujocoEnv.render on a real software OpenGL backend (OSMesa), in a subprocess.

MUJOCO_GL must be set before mujoco is imported, so the check runs in its own
interpreter. CI installs libosmesa6; elsewhere the test is skipped with the reason.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, numpy as np, simkit
env = simkit.make("simkit/Reacher-v0", render_mode="rgb_array", width=64, height=48)
env.reset(seed=0)
first = env.render()
for _ in range(20):
    env.step(np.ones(2, dtype=np.float32))
second = env.render()
env.close()
frames = []
for camera in (None, -1):  # the tracking camera, then the free camera
    cheetah = simkit.make("simkit/Cheetah-v0", render_mode="rgb_array", width=64, height=48,
                          camera=camera)
    cheetah.reset(seed=0)
    frames.append(cheetah.render())
    cheetah.close()
print(json.dumps({"shape": list(first.shape), "dtype": str(first.dtype),
                  "colors": int(len(np.unique(first.reshape(-1, 3), axis=0))),
                  "moved": bool((first != second).any()),
                  "cameras_differ": bool((frames[0] != frames[1]).any())}))
"""


@pytest.mark.skipif(
    ctypes.util.find_library("OSMesa") is None,
    reason="libOSMesa not installed (apt-get install libosmesa6); .ci/run installs it",
)
def test_render_returns_rgb_frames_that_follow_the_state() -> None:
    env = {**os.environ, "MUJOCO_GL": "osmesa", "PYOPENGL_PLATFORM": "osmesa"}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["shape"] == [48, 64, 3]
    assert result["dtype"] == "uint8"
    assert result["colors"] > 1
    assert result["moved"]
    assert result["cameras_differ"]  # Cheetah renders through its tracking camera
