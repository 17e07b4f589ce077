"""No module global is switched on per run (DESIGN.md, issue 35 item 5): what a worker's pipeline
uses of its loader travels in its runtime (``pipeline/runtime.py``), what differs under
``as_energon`` in the spec's policy (``policy.py``).  Read from the source with ``ast``."""

from __future__ import annotations

import ast

from import_graph import import_graph, layer_violations, package_dir

#: Every ``global`` statement left in the package: state of the whole process, never of one run
#: (module, name) -> why.
PROCESS_WIDE = {
    ("energon_mode", "_enabled"): "the switch's flag: as_energon is imported once for the program",
    ("worker_slabs", "active"): "a DataLoader worker process serves one loader's worker for its life; "
    "batch_stack (a public helper user hooks call) has no handle on the pipeline",
    ("loader.handover.slabs", "_logged_too_large"): "a message logged once per process",
    ("decode.av", "_reported"): "the video backend's version, logged once per process",
    ("decode.av", "_soundfile_module"): "an optional module, imported once",
    ("decode.image", "_SIMPLEJPEG"): "an optional module, imported once",
    ("cache.file_cache_pool", "_exiting"): "the interpreter is exiting: every pool stops",
    ("storage.dss", "_cache_dir_lookup"): "where dss:// finds its cache folder, set when epathlib is imported",
}

#: The modules that may read the switch's flag: the plan (loader/api.py decides the policy),
#: the switch itself, and what sits above the core.
READ_THE_SWITCH = ("loader.api", "as_energon", "energon", "cli", "preview", "__init__", "encoders")


def _globals() -> set[tuple[str, str]]:
    root = package_dir()
    found = set()
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Global):
                found.update((module, name) for name in node.names)
    return found


def test_every_module_global_that_is_rebound_is_process_wide() -> None:
    found = _globals()
    unexplained = sorted(found - set(PROCESS_WIDE))
    assert not unexplained, (
        "module globals rebound at run time (pass the runtime or the policy instead, or add the name to "
        f"PROCESS_WIDE with why it is not per run): {unexplained}"
    )
    gone = sorted(set(PROCESS_WIDE) - found)
    assert not gone, f"PROCESS_WIDE lists globals that no longer exist: {gone}"


def test_only_the_plan_reads_the_switch() -> None:
    found = layer_violations(import_graph(), ("energon_mode",), READ_THE_SWITCH)
    assert not found, "modules below loader/api reading energon_mode (take the spec's policy instead):\n" + "\n".join(f"    {edge}" for edge in found)
