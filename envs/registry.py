"""One record per environment family, registered in one place.

A family is everything the suite needs to run, train on and check an env:

* ``entry_point`` -- the env class (or ``"module:Class"``, imported on first use);
* ``id`` -- its Gymnasium id (``gymnasium.make(id)`` works once registered);
* ``config`` -- the trainer's YAML for it (a file name under the packaged ``configs/``,
  or a path); default ``configs/base.yaml``, the shared defaults;
* ``intro`` -- the opening of the agent's system prompt; default :data:`DEFAULT_INTRO`;
* ``judge_template`` -- the step judge's prompt (a file name under ``judges/templates/``,
  a path, or a dict); default ``judges/templates/default.yaml``, a generic next-state
  judge any family can start from;
* ``validator`` -- the oracle check ``python -m envs validate`` runs per task
  (a callable or ``"module:function"``); default :func:`envs.validate.check_oracles`.

:func:`register` works like ``gymnasium.register`` (and calls it)::

    from nextstate.envs import registry
    registry.register("count", entry_point=CountEnv, intro="You count files ...")

Then the trainer (``python -m train --env mypkg.envs:count`` imports ``mypkg.envs``
first), the judge, the prompt builder and
the validator all find it: they read :func:`spec`, never a list of their own.
This module imports nothing heavy, so reading the registry loads no env module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import gymnasium

OPENENV_PREFIX = "openenv:"   # "openenv:URL": an OpenEnv server as a family (envs.openenv.OpenEnvFamily)
DEFAULT_INTRO = "You are an agent. Solve the task by calling the provided tools, one tool call per answer."


def load_object(ref: Any) -> Any:
    """``ref`` itself, or the object a ``"module:attr"`` string names."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class EnvFamily:
    """The registered record of one family (see the module docstring for each field)."""

    name: str
    entry_point: type | str
    id: str
    config: str | Path | None = None
    intro: str = DEFAULT_INTRO
    judge_template: str | Path | Mapping[str, Any] | None = None
    validator: Callable[..., Any] | str | None = None

    def env_class(self) -> type:
        """The env class (imported on first use when given as ``"module:Class"``)."""
        return load_object(self.entry_point)

    def check(self) -> Callable[..., Any] | None:
        """The family's own oracle check for ``python -m envs validate`` (None: the default one)."""
        return None if self.validator is None else load_object(self.validator)


_FAMILIES: dict[str, EnvFamily] = {}


def register(name: str, entry_point: type | str, *, id: str | None = None,
             config: str | Path | None = None, intro: str = DEFAULT_INTRO,
             judge_template: str | Path | Mapping[str, Any] | None = None,
             validator: Callable[..., Any] | str | None = None) -> EnvFamily:
    """Register family ``name`` (and its Gymnasium id, default ``nextstate/<Name>-v0``).

    Registering a name again replaces its record, as ``gymnasium.register`` does.
    """
    record = EnvFamily(name, entry_point, id or f"nextstate/{name.capitalize()}-v0", config, intro,
                       judge_template, validator)
    _FAMILIES[name] = record
    if record.id in gymnasium.envs.registry:  # re-registration: replace without Gymnasium's warning
        del gymnasium.envs.registry[record.id]
    gymnasium.register(id=record.id, entry_point=entry_point)
    return record


def spec(name: str) -> EnvFamily:
    """The record of family ``name``; a one-line ``ValueError`` naming the known ones if none.

    ``openenv:URL`` is registered on first use (:class:`envs.openenv.OpenEnvFamily` reads the server).
    """
    if name not in _FAMILIES and name.startswith(OPENENV_PREFIX):
        try:
            load_object("nextstate.envs.openenv:register_url")(name)
        except ImportError as e:
            raise ValueError(f"env {name!r} needs openenv-core ({e}): pip install 'nextstate[openenv]'") from None
    if name not in _FAMILIES:
        raise ValueError(f"unknown env {name!r}; known: {', '.join(names())} "
                         "(a family of your own: MODULE:NAME, or NAME for a module of that name)")
    return _FAMILIES[name]


def resolve(ref: str) -> str:
    """The family name of ``ref``, importing the module that registers it when need be.

    ``"package.module:name"`` imports ``package.module`` first, as
    ``gymnasium.make("module:Env-v0")`` does; a bare name that is not registered yet is
    imported as a module of that name (``count`` for a ``count.py`` that registers ``count``);
    ``"openenv:URL"`` registers the OpenEnv server at URL as a family of that name.
    """
    if ref.startswith(OPENENV_PREFIX):
        spec(ref)
        return ref
    module, sep, name = ref.rpartition(":")
    if not sep and name in _FAMILIES:
        return name
    try:
        importlib.import_module(module or name)
    except ImportError as e:
        if sep or not (isinstance(e, ModuleNotFoundError) and e.name == name):  # not just "no such module"
            raise ValueError(f"cannot import {module or name!r} for env {name!r}: {e}") from None
    return name


def lazy_names(module: str) -> Callable[[str], Any]:
    """A family package's ``__getattr__``: the names of ``module`` (its env module), imported on
    first use, so that registering the family loads no env module."""
    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(importlib.import_module(module), name)
    return __getattr__


def names() -> list[str]:
    """The registered family names, in registration order."""
    return list(_FAMILIES)
