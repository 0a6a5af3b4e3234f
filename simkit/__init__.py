"""simkit: a simulation-first environment SDK and rollout server for reinforcement learning.

The public API lives here; submodules with a leading underscore are implementation.
"""

from simkit import errors, randomization, snapshot, vector
from simkit._batch import BatchEnv
from simkit._batch_mujoco import BatchMujocoEnv
from simkit._env import Env
from simkit._mujoco import PHYSICS_STATE, ModelField, MujocoEnv
from simkit._multiagent import MultiAgentEnv
from simkit._validation import ActionBounds, validate_action
from simkit.randomization import Choice, Distribution, LogUniform, Normal, Uniform
from simkit.registry import EnvKind, EnvSpec, env_ids, make, register, spec
from simkit.vector import make_vec

__version__ = "0.1.0"

__all__ = [
    # contracts
    "Env",
    "MultiAgentEnv",
    "BatchEnv",
    "BatchMujocoEnv",
    "MujocoEnv",
    "ModelField",
    "PHYSICS_STATE",
    "ActionBounds",
    "validate_action",
    # randomization
    "Distribution",
    "Uniform",
    "LogUniform",
    "Normal",
    "Choice",
    # registry
    "EnvKind",
    "EnvSpec",
    "make",
    "register",
    "spec",
    "env_ids",
    "make_vec",
    # submodules
    "errors",
    "randomization",
    "snapshot",
    "vector",
    "launch",
    "__version__",
]


# Registers the reference envs; cheap, as no env module is imported until make().
import simkit.envs  # noqa: F401


def __getattr__(name: str) -> object:
    """``simkit.launch``: :func:`simkit.clients.launch`, imported on first use (it pulls in
    the learner-side clients, which the SDK alone does not need)."""
    if name == "launch":
        from simkit.clients import launch

        return launch
    raise AttributeError(f"module 'simkit' has no attribute {name!r}")
