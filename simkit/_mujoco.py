"""``simkit.MujocoEnv``: MuJoCo as a first-class simkit backend."""

from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from simkit._env import ActType, Env, ObsType
from simkit.errors import InvalidState, RenderUnavailable
from simkit.randomization import Params

GL_BACKENDS = ("egl", "osmesa", "glfw")
"""The values of ``MUJOCO_GL`` that MuJoCo accepts."""

_GL_MISSING = {
    "egl": "libEGL could not be loaded (a GPU driver's EGL, or Debian's libegl1)",
    "osmesa": "libOSMesa is not installed (Debian/Ubuntu: apt-get install libosmesa6)",
    "glfw": "GLFW could not be loaded (pip install glfw, and a display)",
}


@functools.cache
def _backend_works(backend: str) -> bool:
    """Whether MuJoCo makes an OpenGL context with ``MUJOCO_GL=backend`` (in a child process:
    a failed import leaves MuJoCo half-loaded in this one)."""
    probe = "import mujoco; mujoco.GLContext(1, 1).make_current()"
    env = {k: v for k, v in os.environ.items() if k != "PYOPENGL_PLATFORM"}  # set by MuJoCo
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe],
            env={**env, "MUJOCO_GL": backend},
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def gl_unavailable(backend: str, exc: BaseException, *, at_import: bool) -> RenderUnavailable:
    """The one-line error for MuJoCo refusing ``MUJOCO_GL=backend`` (``at_import``: MuJoCo
    itself would not load, else only rendering failed): what is missing, and which backends
    work on this machine (each probed in a child process)."""
    if backend in _GL_MISSING:
        missing = _GL_MISSING[backend]
    else:
        missing = f"MuJoCo knows no such backend (expected one of {', '.join(GL_BACKENDS)})"
    working = [b for b in GL_BACKENDS if b != backend and _backend_works(b)]
    works = (
        f"MUJOCO_GL={' or MUJOCO_GL='.join(working)} works here"
        if working
        else "no OpenGL backend works here"
    )
    detail = str(exc).splitlines()[-1] if str(exc) else type(exc).__name__
    if not at_import:
        return RenderUnavailable(
            f"MuJoCo cannot render with MUJOCO_GL={backend}: {missing} ({detail}); {works}"
        )
    return RenderUnavailable(
        f"MuJoCo cannot load with MUJOCO_GL={backend}: {missing} ({detail}); {works}, "
        "and with MUJOCO_GL unset everything but rendering works"
    )


try:
    import mujoco
except (ImportError, RuntimeError, AttributeError) as _exc:
    # MuJoCo loads the OpenGL backend named by MUJOCO_GL at import: a missing library or an
    # unknown name fails every MuJoCo env, rendering or not.
    _backend = os.environ.get("MUJOCO_GL")
    if _backend is None or isinstance(_exc, ModuleNotFoundError):
        raise
    raise gl_unavailable(_backend, _exc, at_import=True) from _exc

__all__ = ["MujocoEnv", "ModelField", "PHYSICS_STATE"]


def _no_log_file() -> None:
    """MuJoCo (4.0) prints each warning and also appends it to ``MUJOCO_LOG.TXT`` in the
    working directory, litter wherever an env is built (a deprecation in Gymnasium's
    HalfCheetah model on every ``make``); the printed line stays, the file is not
    written. A log file its user configured elsewhere is left alone, and MuJoCo
    before ``MjLogConfig`` is left as it is."""
    config_type = getattr(mujoco, "MjLogConfig", None)
    if config_type is None:
        return
    config = config_type.get()
    if config.logfile == "MUJOCO_LOG.TXT" and config.logto_file:
        config.logto_file = False
        config.set()


_no_log_file()

PHYSICS_STATE = mujoco.mjtState.mjSTATE_INTEGRATION
"""What a snapshot stores of MjData: ``mjSTATE_FULLPHYSICS`` plus controls, applied
forces and the solver warm-start, the minimum for a bit-identical continuation."""


@dataclass(frozen=True)
class ModelField:
    """Where a randomized parameter is written into the ``MjModel``.

    Args:
        attribute: an ``MjModel`` array, e.g. ``"geom_friction"``, ``"body_mass"``,
            ``"dof_damping"``, ``"actuator_gainprm"``, or ``"opt.gravity"``.
        index: a numpy index into that array (``...`` for all of it).
        op: ``"scale"`` multiplies the nominal value, ``"set"`` replaces it,
            ``"add"`` offsets it. Always applied to the nominal model, so
            episodes never drift.
    """

    attribute: str
    index: Any = ...
    op: Literal["scale", "set", "add"] = "scale"


class MujocoEnv(Env[ObsType, ActType]):
    """A single MJCF model stepped ``frame_skip`` times per env step.

    Randomized model parameters are declared twice: the distribution in
    ``randomization`` and where it lands in ``model_fields``. At every reset (and
    every ``set_state``) those fields are restored from the nominal model and the
    episode's values applied. Snapshots hold ``mj_getState(PHYSICS_STATE)`` plus the
    author's ``state_attributes``.

    Authors implement ``reset_episode`` (``self.data`` has just been reset with
    ``mj_resetData``; set ``qpos``/``qvel`` and call :meth:`forward`) and
    ``step_episode`` (usually :meth:`do_simulation` then compute obs/reward).

    Args:
        model: path to an MJCF file, an MJCF XML string, or an ``MjModel``.
        frame_skip: physics steps per env step.
        width, height: size of ``render()`` images.
        camera: the camera ``render()`` looks through: a camera name of the model, its
            id, or ``-1`` for MuJoCo's free camera (default: :attr:`default_camera`).
        **kwargs: passed to :class:`simkit.Env`.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"]}
    model_fields: ClassVar[Mapping[str, ModelField]] = {}
    state_attributes: ClassVar[tuple[str, ...] | None] = ()
    default_camera: ClassVar[str | int] = -1
    """The camera ``render()`` uses unless ``camera=`` says otherwise (-1: free camera)."""

    def __init__(
        self,
        model: str | Path | mujoco.MjModel,
        *,
        frame_skip: int = 1,
        width: int = 480,
        height: int = 480,
        camera: str | int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(frame_skip, bool) or not isinstance(frame_skip, int) or frame_skip < 1:
            raise ValueError(f"frame_skip must be a positive int, got {frame_skip!r}")
        self.model = _load_model(model)
        self.data = mujoco.MjData(self.model)
        self.frame_skip = frame_skip
        self.width, self.height = width, height
        unknown = set(self.model_fields) - set(self.randomization)
        if unknown:
            raise ValueError(
                f"model_fields {sorted(unknown)} have no distribution in randomization"
            )
        self._nominal = {
            f.attribute: np.array(_resolve(self.model, f.attribute), copy=True)
            for f in self.model_fields.values()
        }
        self._state_size = mujoco.mj_stateSize(self.model, PHYSICS_STATE)
        self.camera = _camera_id(self.model, self.default_camera if camera is None else camera)
        self._renderer: Any = None

    @property
    def dt(self) -> float:
        """Simulated seconds per env step."""
        return float(self.model.opt.timestep) * self.frame_skip

    def apply_params(self, model: mujoco.MjModel, params: Params) -> None:
        """Writes the episode's parameters into ``model``; override for custom fields."""
        write_model_fields(model, self.model_fields, self._nominal, params)

    def _restore_model(self) -> None:
        for attribute, nominal in self._nominal.items():
            _resolve(self.model, attribute)[...] = nominal
        self.apply_params(self.model, self._params)

    def _prepare_episode(self, params: Params) -> None:
        mujoco.mj_resetData(self.model, self.data)
        self._restore_model()

    def forward(self) -> None:
        """Recomputes derived quantities (positions, sensors) after setting qpos/qvel."""
        mujoco.mj_forward(self.model, self.data)

    def do_simulation(self, ctrl: np.ndarray) -> None:
        """Sets ``data.ctrl`` and advances ``frame_skip`` physics steps."""
        self.data.ctrl[:] = ctrl
        mujoco.mj_step(self.model, self.data, nstep=self.frame_skip)

    def get_env_state(self) -> dict[str, Any]:
        physics = np.empty(self._state_size, dtype=np.float64)
        mujoco.mj_getState(self.model, self.data, physics, PHYSICS_STATE)
        return {"physics": physics, "extra": super().get_env_state()}

    def set_env_state(self, state: Mapping[str, Any]) -> None:
        physics = state.get("physics") if isinstance(state, Mapping) else None
        if (
            not isinstance(physics, np.ndarray)
            or physics.dtype != np.float64
            or physics.shape != (self._state_size,)
        ):
            got = (
                f"{physics.dtype} array of shape {physics.shape}"
                if isinstance(physics, np.ndarray)
                else type(physics).__name__
            )
            raise InvalidState(
                f"MuJoCo physics state must be a float64 array of shape ({self._state_size},), "
                f"got {got}"
            )
        extra = state.get("extra", {})
        if not isinstance(extra, Mapping):
            raise InvalidState(f"MuJoCo extra state must be a dict, got {type(extra).__name__}")
        self._restore_model()
        mujoco.mj_setState(self.model, self.data, physics.copy(), PHYSICS_STATE)
        self.forward()
        super().set_env_state(extra)

    def render(self) -> np.ndarray | None:
        """An RGB image ``(height, width, 3)`` uint8 of the current state."""
        if self.render_mode != "rgb_array":
            return None
        if self._renderer is None:
            try:
                self._renderer = mujoco.Renderer(self.model, self.height, self.width)
            except Exception as exc:
                backend = os.environ.get("MUJOCO_GL", "glfw")  # MuJoCo's default
                raise gl_unavailable(backend, exc, at_import=False) from exc
        self._renderer.update_scene(self.data, camera=self.camera)
        return np.asarray(self._renderer.render())

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        super().close()


def _camera_id(model: mujoco.MjModel, camera: str | int) -> int:
    """The id of ``camera`` (a name or an id; -1 is the free camera) in ``model``."""
    names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam)]
    if isinstance(camera, str):
        if camera not in names:
            raise ValueError(f"camera must name one of the model's cameras {names}, got {camera!r}")
        return names.index(camera)
    if isinstance(camera, bool) or not isinstance(camera, int) or not -1 <= camera < model.ncam:
        raise ValueError(
            f"camera must be a camera name, an id in [-1, {model.ncam}) or None, got {camera!r}"
        )
    return camera


def _load_model(model: str | Path | mujoco.MjModel) -> mujoco.MjModel:
    if isinstance(model, mujoco.MjModel):
        return copy.copy(model)  # randomization writes into it; never the caller's
    if isinstance(model, Path) or (isinstance(model, str) and not model.lstrip().startswith("<")):
        path = Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"MJCF model file not found: {path}")
        return mujoco.MjModel.from_xml_path(str(path))
    if isinstance(model, str):
        return mujoco.MjModel.from_xml_string(model)
    raise TypeError(
        f"model must be a path, an XML string or an MjModel, got {type(model).__name__}"
    )


def write_model_fields(
    model: mujoco.MjModel,
    model_fields: Mapping[str, ModelField],
    nominal: Mapping[str, np.ndarray],
    params: Params,
) -> None:
    """Writes each :class:`ModelField`'s parameter into ``model``, relative to ``nominal``.

    Args:
        model: the model to write (an instance's own copy).
        model_fields: parameter name -> the field it sets.
        nominal: field attribute -> its value in the unrandomized model.
        params: the sampled parameters (every name of ``model_fields``).
    """
    for name, field in model_fields.items():
        target = _resolve(model, field.attribute)
        base = nominal[field.attribute][field.index]
        value = np.asarray(params[name], dtype=np.float64)
        if field.op == "scale":
            target[field.index] = base * value
        elif field.op == "add":
            target[field.index] = base + value
        else:
            target[field.index] = value


def _resolve(model: mujoco.MjModel, attribute: str) -> np.ndarray:
    obj: Any = model
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"MjModel has no field {attribute!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, np.ndarray):
        raise ValueError(f"MjModel field {attribute!r} is not an array")
    return obj
