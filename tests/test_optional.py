"""Optional dependencies fail with the pip extra to install, not a bare ImportError."""

from __future__ import annotations

import pytest

from simkit._optional import require
from simkit.errors import MissingDependency, SimkitError


def test_require_returns_the_module() -> None:
    assert require("json", extra="bench", purpose="the test").dumps([1]) == "[1]"


def test_missing_module_names_the_extra() -> None:
    with pytest.raises(MissingDependency, match=r"pip install 'simkit\[bench\]'") as info:
        require("simkit_no_such_module", extra="bench", purpose="the EnvPool comparison")
    assert isinstance(info.value, SimkitError)
    assert isinstance(info.value, ImportError)
    assert "the EnvPool comparison" in str(info.value)


def test_ray_runs_without_ray_installed_name_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``simkit train --ray`` without Ray: one line naming ``simkit[ray]``, exit 2."""
    import sys

    from simkit.cli import main
    from simkit.clients import launch

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(MissingDependency, match=r"pip install 'simkit\[ray\]'"):
        launch("simkit/CartPole-v0", 1, num_envs=1)
    rc = main(["train", "simkit/CartPole-v0", "--ray", "--servers", "1", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1
    assert "pip install 'simkit[ray]'" in err[0]
    assert err[0].startswith("simkit train: ")
