"""Helpers for tests and benchmarks (local S3 server, fault-injecting proxy); not needed at runtime.

Nothing in the library imports this package. Its modules may need the ``dev`` extra
(``moto[server]``) and the ``s3`` extra (``s3fs``).
"""
