"""Energon's ``megatron.energon.tools`` module paths, each exposing ``command`` (a click command).

Thin re-exports: the commands live in :mod:`megatron_energon_lite.cli` (``energon-lite``). Code
and tests written for Energon (``from megatron.energon.tools.prepare import command``) work
with ``megatron_energon_lite.energon.tools`` unchanged.
"""
