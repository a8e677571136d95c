"""Name-to-factory tables for the proxy's extension points (group rankers, rubric sources):
:func:`registrar` makes the ``register_*`` decorator of one, which refuses a name twice."""

from __future__ import annotations

from typing import Any, Callable

Factory = Callable[..., Any]


def registrar(table: dict[str, Factory], what: str) -> Callable[[str], Callable[[Factory], Factory]]:
    """The decorator factory that adds ``@register(name)`` entries to ``table`` (``what``: the
    kind of thing, for the error a name already taken raises)."""
    def register(name: str) -> Callable[[Factory], Factory]:
        def deco(factory: Factory) -> Factory:
            if name in table:
                raise ValueError(f"a {what} named {name!r} is already registered")
            table[name] = factory
            return factory
        return deco
    return register


def make(table: dict[str, Factory], what: str, name: str, **kw: Any) -> Any:
    """``table[name](**kw)``; an unknown name is a one-line ValueError listing the known ones."""
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; registered: {', '.join(sorted(table))}")
    return table[name](**kw)
