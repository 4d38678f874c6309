"""The remote cache on an S3 API (moto's server on 127.0.0.1, through s3fs as any bucket) and its
faults: a server killed mid-upload, an object corrupted in the bucket, a denied write, a
missing bucket, an unreachable endpoint. Each "machine" is an `edgebuild run` process with its
own local store; the endpoint and credentials reach it through the environment, as a user's would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgebuild_testplugin.cli_runner import edgebuild, log_lines
from remote_support import ACCESS_KEY, SECRET_KEY, s3  # noqa: F401  (s3 is a fixture)


def statuses(done) -> dict[str, str]:
    (variant,) = json.loads(done.stdout)["variants"]
    return {s["name"]: s["status"] for s in variant["stages"]}


def keys(done) -> dict[str, str]:
    (variant,) = json.loads(done.stdout)["variants"]
    return {s["name"]: s["key"] for s in variant["stages"]}


def machine(tmp_path: Path, name: str, **extra) -> dict:
    return {"EDGEBUILD_CACHE_DIR": str(tmp_path / f"cache-{name}"), **extra}


def no_secrets(*texts: str, folder: Path | None = None) -> None:
    """Credentials appear in no output, lock file or report."""
    files = [p for p in folder.rglob("*") if p.is_file() and p.suffix in (".json", ".html")] if folder else []
    for text in [*texts, *(p.read_text(errors="ignore") for p in files)]:
        assert SECRET_KEY not in text and ACCESS_KEY not in text


def test_two_machines_share_one_bucket(project, tmp_path, s3):
    remote = s3.make_bucket("team")
    recipe = project()
    first = edgebuild("run", recipe, "--json", "--remote", remote, env=machine(tmp_path, "a"), check=0)
    built = log_lines(tmp_path / "log.txt")
    second = edgebuild("run", recipe, "--json", "--remote", remote, env=machine(tmp_path, "b"), check=0)
    assert statuses(second) == {n: "cached" if n == "resolve" else "pulled" for n in statuses(first)}
    assert log_lines(tmp_path / "log.txt") == built  # the second machine ran no stage body
    objects = s3.objects("team")
    for name, key in keys(first).items():
        if name != "resolve":
            assert f"edgebuild/objects/{key[:2]}/{key}/meta.json" in objects
    status = edgebuild("cache", "status", "--json", "--remote", remote, env=machine(tmp_path, "b"), check=0)
    assert json.loads(status.stdout)["to_push"] == [] and json.loads(status.stdout)["incomplete"] == []
    no_secrets(first.stdout, first.stderr, second.stdout, second.stderr, folder=tmp_path / "out")


@pytest.mark.slow  # ~25 s; test_remote_file.py has a cheap counterpart
def test_server_killed_mid_upload_leaves_the_entry_invisible_and_the_next_push_completes_it(
        project, tmp_path, s3, monkeypatch, cli):
    from edgebuild.store.remote import RemoteStore

    remote = s3.make_bucket("team")
    recipe = project()
    first = edgebuild("run", recipe, "--json", "--no-remote", env=machine(tmp_path, "a"), check=0)
    lower = keys(first)["lower"]
    real_upload = RemoteStore._upload
    uploads = []

    def upload_then_die(self, source, path):
        real_upload(self, source, path)
        uploads.append(path)
        if len(uploads) == 1:
            s3.stop()  # the server dies after the first file of the first entry

    monkeypatch.setattr(RemoteStore, "_upload", upload_then_die)
    code, _, err = cli("cache", "push", lower, "--remote", remote, "--cache-dir", tmp_path / "cache-a")
    assert code == 1 and "unreachable" in err and "Traceback" not in err, err
    monkeypatch.setattr(RemoteStore, "_upload", real_upload)
    s3.restart()
    # its files are there, its manifest is not: no reader sees an entry
    assert any(o.startswith(f"edgebuild/objects/{lower[:2]}/{lower}/out/") for o in s3.objects("team"))
    assert f"edgebuild/objects/{lower[:2]}/{lower}/meta.json" not in s3.objects("team")
    status = edgebuild("cache", "status", "--json", "--remote", remote, env=machine(tmp_path, "a"), check=0)
    assert json.loads(status.stdout)["incomplete"] == [lower]
    pulled = edgebuild("cache", "pull", "--json", "--remote", remote, lower, env=machine(tmp_path, "b"), check=0)
    assert json.loads(pulled.stdout)["pulled"] == 0 and json.loads(pulled.stdout)["missing"] == [lower]
    # the next push completes it, and the other entries
    pushed = edgebuild("cache", "push", "--json", "--remote", remote, env=machine(tmp_path, "a"), check=0)
    assert json.loads(pushed.stdout)["pushed"] == len(keys(first)) - 1  # every stage in the store
    second = edgebuild("run", recipe, "--json", "--remote", remote, env=machine(tmp_path, "c"), check=0)
    assert statuses(second)["lower"] == "pulled" and "ran" not in statuses(second).values()


@pytest.mark.slow  # ~25 s; test_remote_file.py has a cheap counterpart
def test_corrupted_object_is_reported_not_installed_and_built_locally(project, tmp_path, s3):
    remote = s3.make_bucket("team")
    recipe = project()
    first = edgebuild("run", recipe, "--json", "--remote", remote, env=machine(tmp_path, "a"), check=0)
    lower = keys(first)["lower"]
    model = Path("out/default/model/model.onnx").read_bytes()
    name = f"edgebuild/objects/{lower[:2]}/{lower}/out/model/model.onnx"
    client = s3.client()
    good = client.get_object(Bucket="team", Key=name)["Body"].read()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # same size, other bytes
    client.put_object(Bucket="team", Key=name, Body=bytes(bad))
    second = edgebuild("run", recipe, "--json", "--remote", remote, env=machine(tmp_path, "b"), check=0)
    assert statuses(second)["lower"] == "ran" and statuses(second)["optimize"] == "pulled"
    assert "does not match its manifest" in second.stderr and "not installed" in second.stderr
    assert Path("out/default/model/model.onnx").read_bytes() == model
    assert client.get_object(Bucket="team", Key=name)["Body"].read() == good  # replaced by the local build


@pytest.mark.slow  # ~25 s; test_remote_file.py has a cheap counterpart
def test_denied_write_warns_once_and_builds_locally(project, tmp_path, s3, monkeypatch):
    """A reader's credentials (IAM: s3:GetObject and s3:ListBucket only) on a bucket that lacks entries."""
    from moto import settings
    from moto.core.responses import ActionAuthenticatorMixin

    remote = s3.make_bucket("team")
    iam = _iam(s3)
    iam.create_user(UserName="reader")
    iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"],
                                                "Resource": ["arn:aws:s3:::team", "arn:aws:s3:::team/*"]}]}))
    reader = iam.create_access_key(UserName="reader")["AccessKey"]
    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # from here on moto checks IAM
    monkeypatch.setattr(ActionAuthenticatorMixin, "request_count", 0)
    recipe = project()
    done = edgebuild("run", recipe, "--json", "--remote", remote, check=0, env=machine(
        tmp_path, "r", AWS_ACCESS_KEY_ID=reader["AccessKeyId"], AWS_SECRET_ACCESS_KEY=reader["SecretAccessKey"]))
    assert set(statuses(done).values()) == {"ran", "cached"}
    assert done.stderr.count("warning") == 1 and "denied" in done.stderr, done.stderr
    assert reader["SecretAccessKey"] not in done.stderr + done.stdout
    required = edgebuild("run", recipe, "--json", "--force", "--remote", remote, "--remote-required", env=machine(
        tmp_path, "r", AWS_ACCESS_KEY_ID=reader["AccessKeyId"], AWS_SECRET_ACCESS_KEY=reader["SecretAccessKey"]))
    assert required.returncode == 1 and "denied" in required.stderr and "Traceback" not in required.stderr


def _iam(s3):
    import boto3

    return boto3.client("iam", endpoint_url=s3.endpoint, region_name="us-east-1",
                        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)


def test_missing_bucket_is_named_and_the_build_goes_on(project, tmp_path, s3):
    recipe = project()
    done = edgebuild("run", recipe, "--json", "--remote", "s3://no-such-bucket/cache", env=machine(tmp_path, "a"), check=0)
    assert set(statuses(done).values()) == {"ran", "cached"}
    assert done.stderr.count("warning") == 1
    assert "the bucket 'no-such-bucket' does not exist" in done.stderr, done.stderr
    status = edgebuild("cache", "status", "--remote", "s3://no-such-bucket/cache", env=machine(tmp_path, "a"))
    assert status.returncode == 1 and "the bucket 'no-such-bucket' does not exist" in status.stderr
    assert "Traceback" not in status.stderr
    required = edgebuild("run", recipe, "--force", "--remote", "s3://no-such-bucket/cache", "--remote-required",
                         env=machine(tmp_path, "a"))
    assert required.returncode == 1 and "does not exist" in required.stderr


def test_unreachable_endpoint_warns_once(project, tmp_path, s3):
    from remote_support import free_port

    remote = s3.make_bucket("team")
    done = edgebuild("run", project(), "--json", "--remote", remote, check=0,
                     env=machine(tmp_path, "a", AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}"))
    assert set(statuses(done).values()) == {"ran", "cached"}
    assert done.stderr.count("warning") == 1 and "unreachable" in done.stderr, done.stderr


@pytest.mark.slow
def test_two_machines_share_a_shipped_recipe(tmp_path, s3, monkeypatch):
    """recipes/example_ops.yaml (a real bundle: Core ML, a Metal kernel, Core ML; validated against
    onnxruntime) built on one machine; the second pulls every stage and builds nothing."""
    pytest.importorskip("edgebuild_example_ops")
    pytest.importorskip("edgebuild_coreml")
    root = Path(__file__).resolve().parents[1]
    recipe = tmp_path / "example_ops.yaml"
    recipe.write_text(f"extends: {root / 'recipes' / 'example_ops.yaml'}\n"
                      f"source: {{model: {root / 'recipes' / 'models' / 'example_ops.onnx'}}}\n"
                      "outputs: {dir: out}\n")
    monkeypatch.chdir(tmp_path)
    remote = s3.make_bucket("team")
    first = edgebuild("run", recipe, "--json", "--remote", remote, env=machine(tmp_path, "a"), check=0)
    assert "ran" in statuses(first).values()
    second = edgebuild("run", recipe, "--json", "--remote", remote, env=machine(tmp_path, "b"), check=0)
    assert statuses(second) == {n: "cached" if n == "resolve" else "pulled" for n in statuses(first)}
    (variant,) = json.loads(second.stdout)["variants"]
    assert variant["status"] == "built" and not variant["validation"]["failures"]
