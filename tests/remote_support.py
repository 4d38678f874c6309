"""A real S3 API for the remote-cache tests: moto's server on a free 127.0.0.1 port, reached
through s3fs (and boto3 for what a test does behind edgebuild's back) exactly as a bucket
elsewhere would be: the endpoint comes from AWS_ENDPOINT_URL, credentials from the environment."""

from __future__ import annotations

import socket
from dataclasses import dataclass

import pytest

ACCESS_KEY = "AKIAEDGEBUILDTEST000"
SECRET_KEY = "edgebuild-test-secret-never-printed-0123456789"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class S3:
    endpoint: str
    port: int
    server: object

    def client(self, **credentials):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=credentials.get("key", ACCESS_KEY),
                            aws_secret_access_key=credentials.get("secret", SECRET_KEY))

    def make_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}/edgebuild"

    def objects(self, bucket: str) -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def stop(self) -> None:
        """Kill the server (its buckets live on in this process, as moto keeps them in memory)."""
        self.server.stop()

    def restart(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()


def remote_env(s3: S3) -> dict:
    """What a user sets to reach an S3 API that is not AWS: the endpoint and credentials."""
    return {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
            # fail fast on a dead endpoint instead of botocore's default retries
            "AWS_MAX_ATTEMPTS": "2", "AWS_RETRY_MODE": "standard"}


@pytest.fixture
def s3(monkeypatch):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    bucket = S3(f"http://127.0.0.1:{port}", port, server)
    for name, value in remote_env(bucket).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent-edgebuild-test-config")  # no user config of the host
    yield bucket
    import requests

    try:
        requests.post(f"{bucket.endpoint}/moto-api/reset", timeout=5)  # moto's state is per process
    except requests.RequestException:
        pass
    bucket.server.stop()
