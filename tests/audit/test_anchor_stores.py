"""Audit anchors in an S3-compatible bucket with object lock, against moto's S3 server (a
real HTTP server that enforces object lock): each anchor is an object locked for the
retention, read back by version, so hiding or overwriting one does not hide it; a log
cut short is caught as with a file; a bucket that fails is a sentence, never a trace."""

from __future__ import annotations

import json
import socket
import uuid
from datetime import UTC, datetime, timedelta

import boto3
import pytest
from botocore.exceptions import ClientError
from moto.server import ThreadedMotoServer

from dashboard.audit.anchor_stores import S3AnchorStore, StoreFailed, open_store
from dashboard.audit.anchors import Anchor, Anchoring, encode, read_anchors
from tests.audit.test_anchors import cli, cut_tail
from tests.audit.test_chain import record
from tests.conftest import TEST_ANCHOR_KEY

KEY = TEST_ANCHOR_KEY.encode()


@pytest.fixture(scope="module")
def s3_url():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def credentials(monkeypatch):
    for name, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)


@pytest.fixture
def bucket(s3_url, credentials):
    """A fresh bucket with object lock, and a client of it for what a tamperer does."""
    client = boto3.client("s3", endpoint_url=s3_url)
    name = f"anchors-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name, ObjectLockEnabledForBucket=True)
    return client, name


def settings(s3_url: str, **more) -> dict:
    return {"AUDIT_ANCHOR_S3_ENDPOINT": s3_url, "AUDIT_ANCHOR_RETAIN_DAYS": 30, **more}


def anchor_record(seq: int) -> str:
    return encode(KEY, Anchor(seq, f"{seq:064x}", "2026-12-01T00:00:00.000000Z"))


def test_anchors_are_locked_objects_read_back_oldest_first(s3_url, bucket):
    client, name = bucket
    store = open_store(f"s3://{name}/audit", settings(s3_url))
    assert isinstance(store, S3AnchorStore) and store.where == f"s3://{name}/audit/"
    assert store.last() is None and list(store.records()) == []
    written = [anchor_record(seq) for seq in (1, 5, 5, 12)]
    for item in written:
        store.append(item)
    assert list(store.records()) == written
    assert store.last() == written[-1]

    versions = client.list_object_versions(Bucket=name, Prefix="audit/")["Versions"]
    assert len(versions) == 4
    soon = datetime.now(UTC) + timedelta(days=29)
    for version in versions:
        head = client.head_object(Bucket=name, Key=version["Key"],
                                  VersionId=version["VersionId"])
        assert head["ObjectLockMode"] == "COMPLIANCE"
        assert head["ObjectLockRetainUntilDate"] > soon
    # The lock is the bucket's to enforce: deleting an anchor for good is refused.
    with pytest.raises(ClientError, match="AccessDenied"):
        client.delete_object(Bucket=name, Key=versions[0]["Key"],
                             VersionId=versions[0]["VersionId"])


def test_an_anchor_hidden_or_written_over_is_still_read(s3_url, bucket):
    client, name = bucket
    store = open_store(f"s3://{name}/audit/", settings(s3_url))
    for seq in (3, 7):
        store.append(anchor_record(seq))
    newest = client.list_objects_v2(Bucket=name, Prefix="audit/")["Contents"][0]["Key"]
    client.delete_object(Bucket=name, Key=newest)  # a delete marker hides it from a listing
    assert client.list_objects_v2(Bucket=name, Prefix="audit/")["KeyCount"] == 1
    assert store.last() == anchor_record(7)
    client.put_object(Bucket=name, Key=newest, Body=b'{"seq": 99}')  # written over
    anchoring = Anchoring(KEY, store)
    log = read_anchors(anchoring, chain="test-chain")
    assert log.heads == {3: f"{3:064x}", 7: f"{7:064x}"}
    assert log.problem == (f"anchor object 3 of s3://{name}/audit/ is not an anchor (a JSON "
                           "object of seq, hash, signed_at, chain and sig)")


def test_a_log_cut_short_is_caught_by_the_anchor_in_the_bucket(app, runner, owner_session,
                                                               s3_url, bucket):
    _, name = bucket
    app.config.update(AUDIT_ANCHOR_PATH=f"s3://{name}/audit", **settings(s3_url))
    seqs = [event.seq for event in record(owner_session, 5)]
    exit_code, output = cli(runner, owner_session, "checkpoint")
    assert exit_code == 0
    assert output.splitlines()[-1] == \
        f"Signed anchor of seq {seqs[-1]} appended to s3://{name}/audit/."
    assert cli(runner, owner_session, "verify")[0] == 0
    end = cut_tail(owner_session, 3)
    exit_code, output = cli(runner, owner_session, "verify")
    assert exit_code == 1
    assert output.endswith(f"but the log ends at seq {end}: it was cut short after seq {end}")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_bucket_that_fails_is_a_sentence(app, runner, db_session, s3_url, bucket,
                                           monkeypatch):
    _, name = bucket
    record(db_session, 1)
    app.config.update(AUDIT_ANCHOR_PATH="s3://no-such-bucket/audit", **settings(s3_url))
    exit_code, output = cli(runner, db_session, "checkpoint")
    assert exit_code == 1
    assert output.splitlines()[-1] == ("Error: Could not append the anchor to "
                                       "s3://no-such-bucket/audit/: the bucket refused the "
                                       "request (NoSuchBucket).")
    app.config.update(AUDIT_ANCHOR_PATH=f"s3://{name}/audit",
                      AUDIT_ANCHOR_S3_ENDPOINT=f"http://127.0.0.1:{closed_port()}")
    exit_code, output = cli(runner, db_session, "verify")
    assert (exit_code, output) == (1, f"Error: Cannot read the anchors in s3://{name}/audit/: "
                                      "the bucket could not be reached.")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    store = open_store(f"s3://{name}/audit", settings(s3_url))
    with pytest.raises(StoreFailed, match="no credentials for the bucket"):
        store.last()


@pytest.mark.parametrize(("location", "more", "words"), [
    ("s3:///audit", {}, "names no bucket"),
    ("s3://b/audit", {"AUDIT_ANCHOR_LOCK_MODE": "forever"}, "COMPLIANCE, GOVERNANCE"),
    ("s3://b/audit", {"AUDIT_ANCHOR_RETAIN_DAYS": 0}, "at least 1"),
    ("gs://b/audit", {}, "file path or s3://bucket/prefix"),
])
def test_a_store_named_wrong_is_refused_with_what_to_write(location, more, words):
    with pytest.raises(ValueError, match=words):
        open_store(location, {"AUDIT_ANCHOR_RETAIN_DAYS": 30, **more})


def test_the_anchor_key_of_an_object_counts_down_with_the_seq(s3_url, bucket):
    """Why ``last`` is one listing of one key: the newest anchor's object sorts first."""
    client, name = bucket
    store = open_store(f"s3://{name}/a", settings(s3_url))
    for seq in (2, 10, 300):
        store.append(anchor_record(seq))
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=name, Prefix="a/")["Contents"]]
    seqs = [json.loads(client.get_object(Bucket=name, Key=k)["Body"].read())["seq"]
            for k in keys]
    assert seqs == [300, 10, 2]
