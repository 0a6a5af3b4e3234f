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
