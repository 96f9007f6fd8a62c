"""A cheaper `__init__` for frozen, slotted dataclasses built on every request.

Not a wire contract: a private helper of the contract classes (`proto.grant.Grant`) and of the
data-plane frame (`transfer.frame`), kept in this room because both rooms may import only
`cellar.proto` (hence the leading underscore).

Why
    A frozen dataclass's generated `__init__` stores each field with
    `object.__setattr__(self, name, value)` reached through a global lookup: on the machines
    here a 9-field `Grant` costs ~2.2 us to build, more than checking its MAC. The storage node
    builds one per data-plane frame and the SDK one per replica. Storing through the slot
    descriptors themselves (`member_descriptor.__set__`, which bypasses the frozen
    `__setattr__`) gives the same objects for about a quarter of that.

What stays the same
    Signature (positional and keyword), equality, hashing, repr, immutability after `__init__`,
    `dataclasses.replace`: only how the fields are first stored changes. Only for dataclasses
    with `frozen=True, slots=True`, no defaults and no `__post_init__` (checked).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def fast_frozen_init(cls: type[T]) -> type[T]:
    """Replace `cls.__init__` (see the module docstring); returns `cls`."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a frozen, slotted dataclass")
    if hasattr(cls, "__post_init__") or any(
            not f.init or f.default is not dataclasses.MISSING
            or f.default_factory is not dataclasses.MISSING for f in fields):
        raise TypeError(f"{cls.__name__}: defaults and __post_init__ are not supported")
    names = [f.name for f in fields]
    setters: dict[str, Any] = {f"_set_{n}": cls.__dict__[n].__set__ for n in names}
    source = (f"def __init__(self, {', '.join(names)}):\n"
              + "".join(f"    _set_{n}(self, {n})\n" for n in names))
    namespace: dict[str, Any] = {}
    exec(source, setters, namespace)  # noqa: S102 - fixed template over field names
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
