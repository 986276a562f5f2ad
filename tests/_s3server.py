"""A real S3-compatible server for the tests: moto's server mode on 127.0.0.1, s3fs the client.

``s3_server`` (one per test session) starts ``moto.server`` in a child process bound to
127.0.0.1 on a free port the kernel picks, and points botocore at it through the environment
(``AWS_ENDPOINT_URL`` and dummy credentials), so the checkpointer, the bench and child training
processes reach it the way a user's code reaches S3: through s3fs and botocore's usual
configuration. The server stops when the fixture ends, and by itself when the test process
dies (it exits when its stdin, a pipe from the test process, closes) or after an hour at most.
``s3_url`` gives each test a fresh bucket: ``s3://<bucket>/run``.

Import both fixtures into a test module: ``from _s3server import s3_server, s3_url``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

_SERVER = """
import sys, threading
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
done.wait(timeout=3600.0)  # the test process closed the pipe (or died), or an hour passed
server.stop()
"""

ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="session")
def s3_server():
    """The server's endpoint URL; ``os.environ`` points botocore at it while it runs."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        port = int(proc.stdout.readline())
    except ValueError:
        proc.kill()
        pytest.fail("moto's server did not start")
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in (*ENV, "AWS_ENDPOINT_URL")}
    os.environ.update(ENV, AWS_ENDPOINT_URL=endpoint)
    try:
        yield endpoint
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        proc.stdin.close()  # the server's signal to stop
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def s3_url(s3_server):
    """``s3://<a new, empty bucket>/run`` on the test server."""
    import s3fs

    bucket = f"ckptsim-{uuid.uuid4().hex[:12]}"
    fs = s3fs.S3FileSystem()
    fs.mkdir(bucket)
    return f"s3://{bucket}/run"


def s3fs_client():
    """A fresh s3fs client (no listing cached from earlier calls)."""
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True)
