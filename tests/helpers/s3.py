"""An in-process S3 server (moto's ``ThreadedMotoServer``) for the tests of per-rank files on ``s3://`` URLs.

``s3_storage()`` starts a server on a free port, creates the bucket :data:`BUCKET`, and yields the ``s3fs`` options
that reach it (``fsspec.config.conf["s3"]``); rank processes set the same options before they touch ``s3://``. The
tests skip, saying why, where ``moto[server]`` or ``s3fs`` is not installed (``pip install 'lightning-ext[test]'``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["BUCKET", "s3_options", "s3_storage", "use_s3"]

BUCKET = "lightning-ext-tests"
_REGION = "eu-west-1"  # not us-east-1: s3fs sends a location constraint, which us-east-1 refuses


@contextlib.contextmanager
def s3_storage() -> Iterator[dict[str, Any]]:
    """A running S3 server with the bucket; yields the s3fs options (credentials are dummies).

    Use a fresh prefix in the bucket per test: moto keeps what was stored for the whole process.
    """
    pytest.importorskip("s3fs", reason="s3fs is not installed (it is in the 'test' extra)")
    server_module = pytest.importorskip("moto.server", reason="moto[server] is not installed (in the 'test' extra)")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = s3_options(f"http://{host}:{port}")
        with use_s3(options) as fs:
            if not fs.exists(BUCKET):  # moto keeps its state per process, across servers
                fs.mkdir(BUCKET, region_name=_REGION)
        yield options
    finally:
        server.stop()


def s3_options(endpoint: str) -> dict[str, Any]:
    """The s3fs options for the server at ``endpoint``."""
    return {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": endpoint, "region_name": _REGION}}


@contextlib.contextmanager
def use_s3(options: dict[str, Any]) -> Iterator[Any]:
    """Within the block, ``s3://`` URLs reach the test server (fsspec's configuration); yields an S3 filesystem."""
    import fsspec
    import s3fs

    previous = fsspec.config.conf.get("s3")
    fsspec.config.conf["s3"] = options
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        yield fsspec.filesystem("s3")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        if previous is None:
            fsspec.config.conf.pop("s3", None)
        else:
            fsspec.config.conf["s3"] = previous
