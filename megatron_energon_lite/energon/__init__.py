"""Energon's API as adapters on the core: what ``megatron.energon`` names, built from the core's parts.

``flavors/`` (dataset factories), ``wrappers/`` (dataset wrappers: the core's stage recipes under
Energon's names and signatures), ``task_encoder/`` (``TaskEncoder``: the core's hooks plus the
``build_*`` methods, which take the steps of ``pipeline/build.py``), ``metadataset/``,
``epathlib/``, ``av/``, ``media/``, ``tools/`` and ``dataset_config``. Nothing below this package
(the core: ``loader/``, ``pipeline/``, ``decode/``, ``format/``, ``storage/`` and the base
modules) imports it; ``tests/test_layering.py`` checks the import graph. Which
``megatron.energon`` module is which of ours is :data:`ALIASES` below (the switch, ``as_energon.py``, reads it).
"""

__all__ = ["ALIASES", "ENERGON", "OURS", "our_module"]

#: The name Energon's modules live under, and the name they resolve to after the switch.
ENERGON = "megatron.energon"
OURS = "megatron_energon_lite"

#: Every ``megatron.energon`` module this package provides, and ours that it is. A submodule
#: resolves under its nearest entry (``megatron.energon.flavors.webdataset`` ->
#: ``megatron_energon_lite.energon.flavors.webdataset``); a name under no entry but the root is
#: not provided. Energon's own API (its wrappers, flavors, task encoders, ...) lives in our
#: ``energon`` package, on top of the core; the core's modules answer for the names they share.
ALIASES: dict[str, str] = {
    ENERGON: OURS,
    ENERGON + ".av": OURS + ".energon.av",
    ENERGON + ".cache": OURS + ".cache",
    ENERGON + ".cli": OURS + ".cli",
    ENERGON + ".dataset_config": OURS + ".energon.dataset_config",
    ENERGON + ".edataclass": OURS + ".edataclass",
    ENERGON + ".epathlib": OURS + ".energon.epathlib",
    ENERGON + ".errors": OURS + ".errors",
    ENERGON + ".flavors": OURS + ".energon.flavors",
    ENERGON + ".fork_hook": OURS + ".fork_hook",
    ENERGON + ".loader": OURS + ".loader",
    ENERGON + ".media": OURS + ".energon.media",
    ENERGON + ".metadataset": OURS + ".energon.metadataset",
    ENERGON + ".rng": OURS + ".rng",
    ENERGON + ".sample_utils": OURS + ".sample_utils",
    ENERGON + ".source_info": OURS + ".source_info",
    ENERGON + ".task_encoder": OURS + ".energon.task_encoder",
    ENERGON + ".tools": OURS + ".energon.tools",
    ENERGON + ".worker": OURS + ".worker",
    ENERGON + ".wrappers": OURS + ".energon.wrappers",
}


def our_module(fullname: str) -> str | None:
    """Our module for ``megatron.energon...`` module name ``fullname`` (None: not provided)."""
    entry = fullname
    while entry not in ALIASES:
        entry = entry.rpartition(".")[0]
        if entry in ("", ENERGON):  # only the root itself is the package root
            return None
    return ALIASES[entry] + fullname[len(entry) :]
