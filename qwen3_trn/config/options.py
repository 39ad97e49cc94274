"""Config groups whose options have keys of their own (``backend``, ``launcher``, ``data``).

In torchtitan's configurable style, each option is a class with a ``Config``: the class lives in a
higher layer, its Config in ``option_schemas``. Subclassing a group's base config registers the
option in ``<GroupConfig>.options`` by ``name``; the class whose ``Config`` it is becomes its
``_owner``, which ``Config.build()`` makes once ``qwen3_trn.groups`` imported every implementation.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Optional


@dataclass
class OptionConfig:
    """A group's base config (a subclass that sets ``group``) or one of its options (a subclass
    that sets ``name``)."""

    name: str
    # The config group this base types (set by the group's base class only).
    group: ClassVar[str]
    # The group's registry: option name -> its Config (one dict per group).
    options: ClassVar[dict[str, type[OptionConfig]]]
    # The class this Config builds (set when that class is defined).
    _owner: ClassVar[Optional[type]] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "group" in cls.__dict__:
            cls.options = {}
        elif "name" in cls.__dict__:
            known = cls.options.get(cls.name)
            if known is not None and known.__qualname__ != cls.__qualname__:
                raise TypeError(f"{cls.group} option '{cls.name}' is defined twice: {known.__qualname__} and {cls.__qualname__}")
            cls.options[cls.name] = cls

    @classmethod
    def registered(cls) -> dict[str, type[OptionConfig]]:
        """The group's options; none means their modules were never imported."""
        if not cls.options:
            raise RuntimeError(f"no {cls.group} option is registered; import qwen3_trn.config.option_schemas first.")
        return cls.options

    @classmethod
    def default(cls) -> OptionConfig:
        """The default option's Config (the base's ``name``), or the base itself while no option is
        registered."""
        option = cls.options.get(cls.name)
        return option() if option is not None else cls()

    def build(self) -> Any:
        if self._owner is None:
            raise RuntimeError(f"no {self.group} builds {type(self).__name__}; import qwen3_trn.groups first.")
        return self._owner(config=self)


class Configurable:
    """A class built from its ``Config``; defining it makes it the Config's ``_owner``, as
    torchtitan's ``Configurable`` does."""

    Config: ClassVar[type[OptionConfig]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "Config" in cls.__dict__ and "group" not in cls.Config.__dict__:  # a group's base builds nothing
            cls.Config._owner = cls

    def __init__(self, config: OptionConfig) -> None:
        self.config = config

    @classmethod
    def option_name(cls) -> str:
        """The ``<group>=<name>`` that selects this class."""
        return cls.Config.name


def import_submodules(package: str, path: Iterable[str]) -> None:
    """Import every module of ``package``, so each option defined there registers itself."""
    for module in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{module.name}")
