#: The version (pyproject.toml reads it from here). Between releases it is the next one's ``.dev0``,
#: so a checkout never claims the last release while CHANGELOG lists what came after it.
__version__ = "0.2.0.dev0"

#: The Megatron Energon release whose API and dataset format this version provides.
ENERGON_VERSION = "7.4.1"

#: What the ``as_energon`` switch reports as Energon's version (``megatron.energon.__version__``
#: and ``importlib.metadata.version("megatron-energon")``): Energon's, marked as ours by a PEP 440
#: local label, which version comparisons (``packaging``, plain strings) treat as Energon's.
AS_ENERGON_VERSION = f"{ENERGON_VERSION}+lite.{__version__}"
