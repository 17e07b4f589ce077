"""The object-storage fixtures of tests/storage (a moto server on 127.0.0.1, fault proxies), for
the hostile-server tests here."""

from storage.conftest import S3_BUCKET, fault_proxy, s3_server, s3_url  # noqa: F401
