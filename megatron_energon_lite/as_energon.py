"""The one-line switch: ``import megatron_energon_lite.as_energon`` makes ``megatron.energon`` us.

After the import, every ``import megatron.energon``, ``import megatron.energon.X.Y`` and
``from megatron.energon.X import Z`` in this process resolves to ``megatron_energon_lite``,
``megatron_energon_lite.X.Y`` and its ``Z``: the same module objects, registered in
``sys.modules`` under both names, so ``isinstance`` checks agree whichever name the class was
imported by.  Code written for Energon then runs on this package without being edited::

    import megatron_energon_lite.as_energon  # noqa: F401  (first, before anything imports Energon)
    from megatron.energon import get_train_dataset, WorkerConfig

How it works:

1. A finder at the front of ``sys.meta_path`` answers only for names that are
   ``megatron.energon`` or start with ``megatron.energon.``: it imports the module that
   :data:`ALIASES` names for it and hands that very object back.  Every other name,
   ``megatron`` and ``megatron.core`` included, goes to the usual finders, so megatron-core keeps
   working when it is installed.
2. Where no ``megatron`` package can be imported at all, a second finder at the end of
   ``sys.meta_path`` supplies an empty namespace package for it, so ``megatron.energon`` has a
   parent.
3. If the real Energon was imported before the switch, its ``sys.modules`` entries are taken out
   (and one warning says so): the switch wins for every import that follows.  Objects already
   created from the real Energon stay what they are.
4. Every process of the program sees the switch.  It sets the environment variable
   ``ENERGON_LITE_AS_ENERGON=1`` (:data:`ENV_VAR`), which child processes inherit, and the
   package installs a startup hook into site-packages (``megatron_energon_lite_as_energon.pth``)
   that every new interpreter runs: where the variable is set, it imports this module before
   the child's own code runs.  Spawned and forkserver children (``DataLoader`` workers with any
   ``multiprocessing_context``, ``ProcessPoolExecutor``, Python 3.14's default start method) thus
   resolve ``megatron.energon`` as the parent does; forked ones inherit the parent's module table
   anyway.  Where the variable is not set, the hook costs one dictionary lookup.  Setting the
   variable by hand switches a program that does not import this module
   (``ENERGON_LITE_AS_ENERGON=1 python train.py``); deleting it from ``os.environ`` after the
   import keeps the children unswitched.
5. ``importlib.metadata`` finds a ``megatron-energon`` distribution, ours, whose version is
   ``megatron.energon.__version__``: Energon's version this package provides, with a local
   label that marks it as ours (:data:`~megatron_energon_lite._version.AS_ENERGON_VERSION`,
   e.g. ``7.4.1+lite.0.2.0.dev0``).  Code that checks Energon's version at import then runs; without
   the switch, a real Energon installed answers for itself.

Importing the switch also sets :func:`megatron_energon_lite.energon_mode.enabled`, which makes
the few behaviours where Energon and this package differ on principle follow Energon.
:func:`uninstall` undoes all of it (and drops the variable, so children started after it are
not switched).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import os
import pathlib
import re
import sys
import types

from . import energon_mode
from ._version import AS_ENERGON_VERSION, __version__
from .energon import ALIASES, ENERGON, OURS, our_module

__all__ = ["ALIASES", "DISTRIBUTION", "ENERGON", "ENV_VAR", "OURS", "install", "installed", "uninstall"]

logger = logging.getLogger(__name__)

_PARENT = "megatron"

#: Set by the switch, read by the startup hook of every new interpreter (see the module's docstring).
ENV_VAR = "ENERGON_LITE_AS_ENERGON"

#: The distribution name the switch answers for in ``importlib.metadata``.
DISTRIBUTION = "megatron-energon"


def _is_energon_name(fullname: str) -> bool:
    return fullname == ENERGON or fullname.startswith(ENERGON + ".")


class _AliasLoader(importlib.abc.Loader):
    """Loads ``megatron.energon.X`` by importing ``megatron_energon_lite.X`` and returning it."""

    def __init__(self, ours: str) -> None:
        self.ours = ours
        self._own_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.ours)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # The import machinery stamped the alias spec on the module; give it back its own, so
        # its __name__, __package__ and __spec__ keep agreeing (relative imports, reload, pickle).
        if self._own_spec is not None:
            module.__spec__ = self._own_spec


def _normalized(name: str) -> str:
    """A distribution name as ``importlib.metadata`` compares them (PEP 503, with underscores)."""
    return re.sub(r"[-_.]+", "_", name).lower()


class _EnergonDistribution(importlib.metadata.Distribution):
    """The ``megatron-energon`` distribution the switch makes: this package under Energon's name."""

    _METADATA = (
        "Metadata-Version: 2.1\n"
        f"Name: {DISTRIBUTION}\n"
        f"Version: {AS_ENERGON_VERSION}\n"
        f"Summary: megatron-energon-lite {__version__} as megatron.energon (the megatron_energon_lite.as_energon switch)\n"
    )

    def read_text(self, filename: str) -> str | None:
        if filename in ("METADATA", "PKG-INFO"):
            return self._METADATA
        if filename == "top_level.txt":
            return _PARENT + "\n"
        return None

    def locate_file(self, path: str | os.PathLike[str]) -> pathlib.Path:
        return pathlib.Path(sys.modules[OURS].__file__).parent.parent / path


class _EnergonFinder(importlib.metadata.DistributionFinder):
    """Answers for ``megatron.energon`` and its submodules only, and for the ``megatron-energon``
    distribution (ahead of an installed one: the finder is first on ``sys.meta_path``)."""

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        if context.name is None or _normalized(context.name) == _normalized(DISTRIBUTION):
            yield _EnergonDistribution()

    def find_spec(self, fullname, path=None, target=None):
        if not _is_energon_name(fullname):
            return None
        ours = our_module(fullname)
        if ours is None:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: megatron_energon_lite does not implement this part of Energon "
                f"(the megatron_energon_lite.as_energon switch provides {', '.join(sorted(ALIASES))})",
                name=fullname,
            )
        module = sys.modules.get(ours)
        if module is not None:
            is_package = hasattr(module, "__path__")
        else:
            try:
                found = importlib.util.find_spec(ours)
            except ModuleNotFoundError as exc:
                # A missing parent of ``ours`` means ``ours`` is missing; anything else is a
                # real error inside our package and must surface as it is.
                if exc.name is None or not (ours == exc.name or ours.startswith(exc.name + ".")):
                    raise
                found = None
            if found is None:
                raise ModuleNotFoundError(
                    f"No module named {fullname!r}: the megatron_energon_lite.as_energon switch maps it to "
                    f"{ours!r}, which does not exist (megatron_energon_lite does not implement this part of Energon)",
                    name=fullname,
                )
            is_package = found.submodule_search_locations is not None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(ours), is_package=is_package)


class _PlaceholderLoader(importlib.abc.Loader):
    """An empty namespace package, for ``megatron`` when no real one is installed."""

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        module.__doc__ = "Placeholder parent of megatron.energon, made by megatron_energon_lite.as_energon."


class _ParentFallbackFinder(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: supplies ``megatron`` only when no other finder could."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _PARENT:
            return None
        spec = importlib.machinery.ModuleSpec(_PARENT, _PlaceholderLoader(), is_package=True)
        spec.submodule_search_locations = []
        return spec


def _is_ours(module: object) -> bool:
    name = getattr(module, "__name__", None)
    return isinstance(name, str) and (name == OURS or name.startswith(OURS + "."))


class _Switch:
    """What :func:`install` changed, so that :func:`uninstall` can put it back."""

    def __init__(self) -> None:
        self.finder: _EnergonFinder | None = None
        self.fallback: _ParentFallbackFinder | None = None
        #: Modules of the real Energon that were in ``sys.modules`` at install time.
        self.replaced: dict[str, types.ModuleType] = {}


_switch = _Switch()


def installed() -> bool:
    """True while the switch is active in this process."""
    return _switch.finder is not None


def install() -> None:
    """Activates the switch (importing this module does it; calling it again does nothing)."""
    energon_mode.enable()
    if installed():
        return
    os.environ[ENV_VAR] = "1"
    # megatron.energon.__version__ is Energon's as the metadata reports it (see the docstring).
    sys.modules[OURS].__version__ = AS_ENERGON_VERSION
    present = {name: module for name, module in sys.modules.items() if _is_energon_name(name)}
    real = {name: module for name, module in present.items() if not _is_ours(module)}
    # Entries of the real Energon are replaced by ours where ours is loaded already, and dropped
    # otherwise (the next import of that name goes through the finder).
    for name in present:
        ours_name = our_module(name)
        ours = None if ours_name is None else sys.modules.get(ours_name)
        if ours is not None:
            sys.modules[name] = ours
        else:
            del sys.modules[name]
    parent = sys.modules.get(_PARENT)
    if parent is not None and "energon" in vars(parent):
        if ENERGON in sys.modules:
            parent.energon = sys.modules[ENERGON]
        else:
            delattr(parent, "energon")
    if real:
        logger.warning(
            "megatron.energon was imported before megatron_energon_lite.as_energon (%d modules, e.g. %r); "
            "from now on megatron.energon is megatron_energon_lite, but objects made from the real Energon "
            "before the switch stay Energon objects. Import megatron_energon_lite.as_energon first.",
            len(real),
            min(real),
        )
    _switch.replaced = real
    _switch.finder = _EnergonFinder()
    _switch.fallback = _ParentFallbackFinder()
    sys.meta_path.insert(0, _switch.finder)
    sys.meta_path.append(_switch.fallback)
    logger.info(
        "megatron.energon now resolves to megatron_energon_lite %s (as Energon %s), in this process and in "
        "the processes it starts (%s=1); megatron_energon_lite.as_energon.uninstall() undoes it",
        __version__,
        AS_ENERGON_VERSION,
        ENV_VAR,
    )


def uninstall() -> None:
    """Undoes the switch: removes the finders and every ``megatron.energon*`` alias.

    Modules of the real Energon that the switch took out of ``sys.modules`` are put back, and a
    ``megatron`` placeholder it created is removed.  This module leaves ``sys.modules`` too, so a
    later ``import megatron_energon_lite.as_energon`` switches again.
    """
    for finder in (_switch.finder, _switch.fallback):
        if finder is not None and finder in sys.meta_path:
            sys.meta_path.remove(finder)
    _switch.finder = _switch.fallback = None
    for name in [n for n, m in sys.modules.items() if _is_energon_name(n) and _is_ours(m)]:
        del sys.modules[name]
    parent = sys.modules.get(_PARENT)
    if parent is not None and isinstance(getattr(parent, "__loader__", None), _PlaceholderLoader):
        del sys.modules[_PARENT]
    elif parent is not None:
        if _is_ours(vars(parent).get("energon")):
            delattr(parent, "energon")
        if ENERGON in _switch.replaced:
            parent.energon = _switch.replaced[ENERGON]
    sys.modules.update(_switch.replaced)
    _switch.replaced = {}
    os.environ.pop(ENV_VAR, None)
    sys.modules[OURS].__version__ = __version__
    energon_mode.disable()
    sys.modules.pop(__name__, None)


install()
