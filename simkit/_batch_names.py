"""The private names :class:`simkit.BatchEnv`'s base classes use on the instance an
author's subclass shares with them, and the check at class creation that the subclass
does not reuse one.

The base classes keep their state in one attribute, ``_simkit``, and name their helpers
``__name`` (which Python mangles to ``_BatchEnv__name``); Gymnasium's ``VectorEnv`` adds
``_np_random``, ``_np_random_seed`` and ``_add_info``. An author's attribute or method
of one of these names would silently replace the base's and break the batch far from
the cause, so a subclass defined outside simkit may neither define one (a method or
class attribute) nor assign it on ``self`` in its methods; the error names the name,
the base class that owns it and the fix.
"""

from __future__ import annotations

import dis
import types
from collections.abc import Iterator
from functools import cache
from typing import Any

__all__ = ["check_author_names", "reserved_names"]

_FRAMEWORK = ("simkit._", "gymnasium.")
"""Modules whose classes are base classes: their private names are reserved."""


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _functions(value: Any) -> Iterator[types.FunctionType]:
    """The plain functions behind a class attribute (methods, properties, static and
    class methods)."""
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    parts = [value.fget, value.fset, value.fdel] if isinstance(value, property) else [value]
    for fn in parts:
        if isinstance(fn, types.FunctionType):
            yield fn


def _self_stores(fn: types.FunctionType) -> Iterator[tuple[str, str]]:
    """``(attribute, function name)`` of every ``self.<attribute> = ...`` in ``fn`` (plain,
    chained, unpacked and augmented assignments, nested functions included), where
    ``self`` is the method's first parameter."""
    code = fn.__code__
    if code.co_argcount == 0:
        return
    me = code.co_varnames[0]
    stack = [code]
    while stack:
        co = stack.pop()
        ops = list(dis.get_instructions(co))
        for k, ins in enumerate(ops):
            if ins.opname == "STORE_ATTR" and _stores_on(ops, k, me):
                yield str(ins.argval), fn.__name__
        stack.extend(c for c in co.co_consts if isinstance(c, types.CodeType))


def _loads(ins: dis.Instruction, name: str) -> bool:
    """Whether ``ins`` pushes the local (or closed-over) variable ``name`` last."""
    if ins.opname in ("LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE", "LOAD_FAST_CHECK"):
        return bool(ins.argval == name)
    if ins.opname == "LOAD_FAST_LOAD_FAST":  # Python 3.13: two locals, the object last
        return isinstance(ins.argval, tuple) and ins.argval[-1] == name
    return False


def _stores_on(ops: list[dis.Instruction], k: int, me: str) -> bool:
    """Whether the ``STORE_ATTR`` at ``ops[k]`` stores on the variable ``me``: the
    object is pushed right before it, or, for ``self.x += v``, loaded with ``COPY``
    before the ``LOAD_ATTR`` of the same name."""
    if k == 0:
        return False
    if _loads(ops[k - 1], me):
        return True
    if ops[k - 1].opname != "SWAP":
        return False
    name = ops[k].argval
    for j in range(k - 2, 1, -1):
        if ops[j].opname == "LOAD_ATTR" and ops[j].argval == name:
            return ops[j - 1].opname == "COPY" and _loads(ops[j - 2], me)
    return False


@cache
def _names_of(base: type) -> frozenset[str]:
    """The private names one framework class defines, declares or assigns on ``self``."""
    names = {n for n in vars(base) if _is_private(n)}
    names.update(n for n in vars(base).get("__annotations__", {}) if _is_private(n))
    for value in vars(base).values():
        for fn in _functions(value):
            names.update(n for n, _ in _self_stores(fn) if _is_private(n))
    return frozenset(names)


def _framework(cls: type) -> bool:
    return cls.__module__.startswith(_FRAMEWORK)


def reserved_names(cls: type) -> dict[str, type]:
    """Each private name the framework bases of ``cls`` use, with the first base (in
    method resolution order) that uses it. A base's mangled names (``_Base__name``)
    count only for an author's class of the same name: no other class spells them."""
    out: dict[str, type] = {}
    for base in cls.__mro__:
        if _framework(base):
            mangled = f"_{base.__name__.lstrip('_')}__"
            same = not _framework(cls) and base.__name__.lstrip("_") == cls.__name__.lstrip("_")
            for name in sorted(_names_of(base)):
                if same or not name.startswith(mangled):
                    out.setdefault(name, base)
    return out


def check_author_names(cls: type) -> None:
    """Refuses a batch env class, defined outside simkit, that defines or assigns on
    ``self`` a private name its framework bases use.

    Raises:
        TypeError: names the first clash, where it is made, the base class that owns the
            name and how to fix it.
    """
    if _framework(cls):
        return
    reserved = reserved_names(cls)
    clashes: list[tuple[str, str]] = []  # its author bases were checked when made
    for name, value in vars(cls).items():
        if name in reserved:
            clashes.append((name, f"{cls.__name__} defines {name}"))
        for fn in _functions(value):
            clashes.extend(
                (attr, f"{cls.__name__}.{where} assigns self.{attr}")
                for attr, where in _self_stores(fn)
                if attr in reserved
            )
    if not clashes:
        return
    name, where = clashes[0]
    owner = reserved[name]
    others = sorted({n for n, _ in clashes[1:]} - {name})
    also = f" (also: {', '.join(others)})" if others else ""
    raise TypeError(
        f"{where}, a private name the base class {owner.__module__}.{owner.__qualname__} "
        f"uses itself{also}; rename it (for example without the leading underscore, "
        f"or with a prefix of your own). Names starting with '_' that the base classes "
        f"use are reserved: {cls.__name__}.reserved_names() lists them"
    )
