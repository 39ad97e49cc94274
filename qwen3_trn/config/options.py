"""Config groups whose options have keys of their own (``backend``, ``launcher``, ``data``).

In torchtitan's configurable style, each option is a class with a ``Config`` dataclass
(``NativeBackend.Config``), the class defined in the option's own module of a higher layer and
its Config in ``option_schemas`` (so that a config is composed and checked without importing
the implementations, nor torch). The group's base config here (``BackendConfig``) holds the keys
every option shares and the ``name`` that chooses one; subclassing it registers the option's
Config in the group's one registry (``<GroupConfig>.options``, keyed by the option's ``name``),
and the class that takes a Config as its ``Config`` becomes its ``_owner``, which
``Config.build()`` makes (once ``qwen3_trn.groups`` imported every implementation). Hydra's
ConfigStore entries (``store``), typing a composed config (``typed``) and every builder look
options up there.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Optional


@dataclass
class OptionConfig:
    """The base of a group's config; a subclass that sets ``group`` is a group, one that sets
    ``name`` an option of the group it derives from."""

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
        """The group's options; none at all means their modules were never imported."""
        if not cls.options:
            raise RuntimeError(f"no {cls.group} option is registered; import qwen3_trn.config.option_schemas first.")
        return cls.options

    @classmethod
    def default(cls) -> OptionConfig:
        """The group's default option (its base's ``name``) as that option's Config, with the
        option's own keys; the base itself while no option is registered."""
        option = cls.options.get(cls.name)
        return option() if option is not None else cls()

    def build(self) -> Any:
        """The object this option configures, made from this config."""
        if self._owner is None:
            raise RuntimeError(f"no {self.group} builds {type(self).__name__}; import qwen3_trn.groups first.")
        return self._owner(config=self)


class Configurable:
    """A class built from its ``Config`` (an ``OptionConfig`` subclass, nested or assigned):
    defining the class makes it the Config's ``_owner``, as torchtitan's ``Configurable`` does."""

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
    """Import every module of ``package`` (its ``__name__`` and ``__path__``), so that each option
    defined there registers itself."""
    for module in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{module.name}")
