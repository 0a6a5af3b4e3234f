"""simkit: a simulation-first environment SDK and rollout server for reinforcement learning.

The public API lives here; submodules with a leading underscore are implementation.
"""

from typing import TYPE_CHECKING

from simkit import errors, randomization, snapshot
from simkit._env import Env
from simkit._validation import ActionBounds, validate_action
from simkit._version import __version__
from simkit.randomization import Choice, Distribution, LogUniform, Normal, Uniform
from simkit.registry import EnvKind, EnvSpec, env_ids, make, register, spec

if TYPE_CHECKING:
    from simkit import seeding, vector
    from simkit._batch import BatchEnv
    from simkit._batch_mujoco import BatchMujocoEnv
    from simkit._mujoco import PHYSICS_STATE, ModelField, MujocoEnv
    from simkit._multiagent import MultiAgentEnv
    from simkit.learn import Policy, evaluate, load_policy, train
    from simkit.vector import make_vec

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
    "seeding",
    "snapshot",
    "vector",
    "launch",
    # training from Python (simkit.learn)
    "train",
    "load_policy",
    "evaluate",
    "Policy",
    "__version__",
]


# Registers the reference envs; cheap, as no env module is imported until make().
import simkit.envs  # noqa: F401
from simkit.registry import _mark_startup

_mark_startup()  # every simkit process registers these alike (rollout servers too)

# These names load their modules at first use, not with simkit: MuJoCo loads the OpenGL
# backend named by MUJOCO_GL at import, and a missing one must not break the envs that need
# neither; the batch and vector machinery (Gymnasium's vector package, the keyed seeding) is
# more than a command line that lists envs or prints its help needs.
_LAZY_NAMES = {
    "MujocoEnv": "simkit._mujoco",
    "ModelField": "simkit._mujoco",
    "PHYSICS_STATE": "simkit._mujoco",
    "BatchMujocoEnv": "simkit._batch_mujoco",
    "BatchEnv": "simkit._batch",
    "MultiAgentEnv": "simkit._multiagent",
    "make_vec": "simkit.vector",
}
# simkit.learn loads torch: on first use too.
_LEARN_NAMES = ("train", "load_policy", "evaluate", "Policy")
# Subpackages a reader names after `import simkit` (`simkit.testing.register_profiles()`,
# `simkit.clients.RemoteVectorEnv`), imported on first use as `import simkit.X` would.
_SUBMODULES = (
    "cli",
    "clients",
    "integrations",
    "learn",
    "models",
    "protocol",
    "recording",
    "seeding",
    "servers",
    "testing",
    "vector",
)


def __getattr__(name: str) -> object:
    """``simkit.launch``: :func:`simkit.clients.launch`, imported on first use (it pulls in
    the learner-side clients, which the SDK alone does not need); the MuJoCo classes, which
    import MuJoCo on first use, and the batch and vector classes; :mod:`simkit.learn`'s
    functions, which import torch; the subpackages (``simkit.testing``, ``simkit.vector``,
    ...), as ``import simkit.X``."""
    if name == "launch":
        from simkit.clients import launch

        return launch
    if name in _LAZY_NAMES:
        import importlib

        return getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    if name in _LEARN_NAMES:
        from simkit import learn

        return getattr(learn, name)
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"simkit.{name}")
    raise AttributeError(f"module 'simkit' has no attribute {name!r}")
