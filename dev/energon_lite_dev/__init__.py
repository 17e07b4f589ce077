"""Test and development support for megatron-energon-lite; not part of the library.

``synthetic`` is the library's megatron_energon_lite.synthetic under its old name,
``s3server`` runs a local S3 server (moto) with a fault-injecting proxy, ``states`` reads
loader states (what an elastic restore carried), and ``resume`` checks that a loader resumes
exactly from its saved states (``check_loader_resume``). This distribution lives in ``dev/`` of the
repository and is installed by ``scripts/setup.sh``
(``pip install --no-deps -e ./dev``); the ``megatron-energon-lite`` wheel does not contain it.
Its modules may need the ``dev`` extra (``moto[server]``) and the ``s3`` extra (``s3fs``).
"""
