"""Callbacks around ``os.fork`` that do not keep their owners alive (Energon's ``fork_hook``).

Dataloader workers are forked from the main process. Anything that must not be shared across a
fork (an open sqlite connection, a thread pool, a lock held by another thread) can be reset in
the child by registering a callback::

    class Reader(ForkMixin):
        def __after_in_child_fork__(self):
            self._db = None          # reopen lazily in the worker

The registries hold weak references: an object that is garbage collected drops out of them, so
registering never leaks. ``make_persistent=True`` keeps a strong reference instead (for lambdas
and other callables nobody else holds).
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DataclassForkMixin",
    "ForkMixin",
    "WeakCallbacks",
    "after_in_child_fork_hook",
    "after_in_parent_fork_hook",
    "before_fork_hook",
]

logger = logging.getLogger(__name__)


class _Strong:
    """A "reference" that always resolves: what ``make_persistent`` stores."""

    __slots__ = ("target",)

    def __init__(self, target: Callable[..., Any]) -> None:
        self.target = target

    def __call__(self) -> Callable[..., Any]:
        return self.target


class WeakCallbacks:
    """A set of callbacks, each held by a weak reference and dropped when its owner dies.

    A bound method is held through :class:`weakref.WeakMethod` (it lives as long as its object),
    a function through :class:`weakref.ref`. Adding the same method or function again replaces
    the earlier entry, so each runs once per :meth:`run`.
    """

    _hooks: dict[Hashable, Callable[[], Callable[..., Any] | None]]

    def __init__(self) -> None:
        self._hooks = {}

    def add_hook(self, callable: Callable[..., Any], make_persistent: bool = False) -> None:
        """Adds ``callable``; ``make_persistent`` holds it strongly (never dropped)."""
        owner = getattr(callable, "__self__", None)
        if make_persistent:
            key: Hashable = ("strong", id(callable))
            self._hooks[key] = _Strong(callable)
        elif owner is not None and hasattr(callable, "__func__"):
            key = ("method", id(owner), id(callable.__func__))
            self._hooks[key] = weakref.WeakMethod(callable, self._remover(key))
        else:
            key = ("function", id(callable))
            self._hooks[key] = weakref.ref(callable, self._remover(key))

    def _remover(self, key: Hashable) -> Callable[[Any], None]:
        hooks = self._hooks

        def remove(dead_ref: Any) -> None:
            # Only drop the entry this reference made; the key may have been re-added since.
            if hooks.get(key) is dead_ref:
                del hooks[key]

        return remove

    def run(self, *args: Any, **kwargs: Any) -> None:
        """Calls every live callback with the given arguments (an exception propagates)."""
        for ref in list(self._hooks.values()):
            callback = ref()
            if callback is not None:
                callback(*args, **kwargs)

    def run_logged(self, *args: Any, **kwargs: Any) -> None:
        """Like :meth:`run`, but a failing callback is logged and the others still run (fork time)."""
        for ref in list(self._hooks.values()):
            callback = ref()
            if callback is None:
                continue
            try:
                callback(*args, **kwargs)
            except Exception:
                logger.exception("fork hook %r failed in process %d; continuing", callback, os.getpid())

    def __len__(self) -> int:
        return len(self._hooks)


_before_fork_hooks = WeakCallbacks()
_after_in_child_fork_hooks = WeakCallbacks()
_after_in_parent_fork_hooks = WeakCallbacks()


def before_fork_hook(callable: Callable[[], None], make_persistent: bool = False) -> None:
    """Runs ``callable`` in the parent just before every fork.

    Pass a bound method or a function someone else keeps alive (not a lambda), or set
    ``make_persistent``: the registry only holds a weak reference otherwise.
    """
    _before_fork_hooks.add_hook(callable, make_persistent)


def after_in_parent_fork_hook(callable: Callable[[], None], make_persistent: bool = False) -> None:
    """Runs ``callable`` in the parent just after every fork (see :func:`before_fork_hook`)."""
    _after_in_parent_fork_hooks.add_hook(callable, make_persistent)


def after_in_child_fork_hook(callable: Callable[[], None], make_persistent: bool = False) -> None:
    """Runs ``callable`` in the new child just after every fork (see :func:`before_fork_hook`)."""
    _after_in_child_fork_hooks.add_hook(callable, make_persistent)


_MIXIN_HOOKS = (
    ("__before_fork__", before_fork_hook),
    ("__after_in_child_fork__", after_in_child_fork_hook),
    ("__after_in_parent_fork__", after_in_parent_fork_hook),
)


def _register_overridden(obj: Any, base: type) -> None:
    """Registers the fork methods that ``obj``'s class overrides (the base ones do nothing)."""
    for name, register in _MIXIN_HOOKS:
        if getattr(type(obj), name) is not getattr(base, name):
            register(getattr(obj, name))


class ForkMixin:
    """Registers a subclass's ``__before_fork__`` / ``__after_in_child_fork__`` /
    ``__after_in_parent_fork__`` overrides as fork hooks when an instance is made.

    The instance stays collectable: the hooks hold it weakly.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _register_overridden(self, ForkMixin)

    def __before_fork__(self) -> None:
        """Runs in the parent before a fork."""

    def __after_in_child_fork__(self) -> None:
        """Runs in the child after a fork."""

    def __after_in_parent_fork__(self) -> None:
        """Runs in the parent after a fork."""


@dataclass
class DataclassForkMixin:
    """:class:`ForkMixin` for dataclasses: registers in ``__post_init__``.

    A subclass that defines its own ``__post_init__`` must call ``super().__post_init__()``.
    """

    def __post_init__(self) -> None:
        _register_overridden(self, DataclassForkMixin)

    def __before_fork__(self) -> None:
        """Runs in the parent before a fork."""

    def __after_in_child_fork__(self) -> None:
        """Runs in the child after a fork."""

    def __after_in_parent_fork__(self) -> None:
        """Runs in the parent after a fork."""


os.register_at_fork(
    before=_before_fork_hooks.run_logged,
    after_in_child=_after_in_child_fork_hooks.run_logged,
    after_in_parent=_after_in_parent_fork_hooks.run_logged,
)
