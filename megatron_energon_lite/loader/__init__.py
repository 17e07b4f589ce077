"""The loader: Energon's entry points (``get_train_dataset``, ``get_val_dataset``, ``get_loader``,
``get_savable_loader``) and the only part of the package that knows about dataloader workers
(where a pass ends and how the next begins is ``pipeline/passes.py``'s; the state format is
``rank_state.py``'s).

- ``api.py``: the public ``get_*`` functions and their arguments; ``plan_spec`` builds a spec.
- ``dataset.py``: ``PipelineDataset``, the dataset of a spec.
- ``streams.py``: what the DataLoader iterates in each worker, and what a worker sends.
- ``dataloader.py``: ``SavableDataLoader``: iteration, watchdog reports, skips, stall report, state.

The public names resolve lazily (PEP 562), as the package's own do: importing a light part of
the loader (a checkpoint's state format, say) does not load torch.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from .api import get_loader, get_savable_loader, get_train_dataset, get_val_dataset, get_val_datasets
    from .blend_report import blend_report
    from .dataloader import SavableDataLoader

#: Public name -> the module (relative to this package) that defines it.
_LAZY: dict[str, str] = {
    "SavableDataLoader": ".dataloader",
    "blend_report": ".blend_report",
    "get_loader": ".api",
    "get_savable_loader": ".api",
    "get_train_dataset": ".api",
    "get_val_dataset": ".api",
    "get_val_datasets": ".api",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
