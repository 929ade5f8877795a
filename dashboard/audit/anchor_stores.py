"""Where signed audit anchors are kept, outside the database: appended, never rewritten,
read back oldest first. ``AUDIT_ANCHOR_PATH`` names a file, or ``s3://bucket/prefix`` an
S3-compatible bucket with object lock (each anchor an object locked until it may go)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

# Enough of a file's end to hold its last anchor (a line is about 200 bytes).
_TAIL_BYTES = 4096
# Object keys count down, so a listing (in key order) starts at the newest anchor.
_KEY_DIGITS = 20
_KEY_TOP = 10**_KEY_DIGITS - 1
LOCK_MODES = ("COMPLIANCE", "GOVERNANCE")
_READERS = 16  # anchor objects read at once by verify


class StoreFailed(OSError):
    """The store did not answer or refused; ``strerror`` says so in a sentence."""

    def __init__(self, sentence: str) -> None:
        super().__init__(0, sentence)


class AnchorStore(Protocol):
    where: str
    unit: str  # what one record is, for "<unit> N of <where>"

    def append(self, record: str) -> None: ...

    def records(self) -> Iterator[str]: ...

    def last(self) -> str | None: ...


@dataclass(frozen=True)
class FileAnchorStore:
    """A JSON-lines file, one anchor a line; each is one ``O_APPEND`` write, synced."""

    path: Path
    where: str = field(init=False)
    unit: str = "line"

    def __post_init__(self) -> None:
        object.__setattr__(self, "where", str(self.path))

    def append(self, record: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            data = (record + "\n").encode("utf-8")
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data  # after a torn last line, not onto it
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def records(self) -> Iterator[str]:
        if not self.path.exists():
            return
        with self.path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                yield line.rstrip("\n")

    def last(self) -> str | None:
        if not self.path.exists():
            return None
        with self.path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - _TAIL_BYTES))
            lines = fh.read().decode("utf-8", errors="replace").splitlines()
        return lines[-1] if lines else None


@dataclass(frozen=True)
class S3AnchorStore:
    """One object per anchor, written with an object-lock retention (``COMPLIANCE``: not
    even the account's root may delete or shorten it before then). Read back by object
    *version*, so an anchor hidden behind a delete marker, or a later version written over
    its key, is still read: each version is one record, and a bad one is reported."""

    client: Any
    bucket: str
    prefix: str
    retain_days: int
    lock_mode: str = "COMPLIANCE"
    where: str = field(init=False)
    unit: str = "anchor object"

    def __post_init__(self) -> None:
        object.__setattr__(self, "where", f"s3://{self.bucket}/{self.prefix}")

    def _key(self, record: str) -> str:
        seq = int(json.loads(record)["seq"])
        return (f"{self.prefix}{_KEY_TOP - seq:0{_KEY_DIGITS}d}-"
                f"{_KEY_TOP - time.time_ns():0{_KEY_DIGITS}d}.json")

    def append(self, record: str) -> None:
        until = datetime.now(UTC) + timedelta(days=self.retain_days)
        self._call("put_object", Bucket=self.bucket, Key=self._key(record),
                   Body=record.encode("utf-8"), ContentType="application/json",
                   ObjectLockMode=self.lock_mode, ObjectLockRetainUntilDate=until)

    def _versions(self, page_size: int = 1000) -> Iterator[dict[str, Any]]:
        """Every version under the prefix, newest anchor first (delete markers skipped),
        a page at a time."""
        marker: dict[str, str] = {}
        while True:
            page = self._call("list_object_versions", Bucket=self.bucket,
                              Prefix=self.prefix, MaxKeys=page_size, **marker)
            yield from page.get("Versions", ())
            if not page.get("IsTruncated"):
                return
            marker = {"KeyMarker": page["NextKeyMarker"],
                      "VersionIdMarker": page["NextVersionIdMarker"]}

    def _read(self, version: dict[str, Any]) -> str:
        body = self._call("get_object", Bucket=self.bucket, Key=version["Key"],
                          VersionId=version["VersionId"])["Body"]
        return body.read().decode("utf-8", errors="replace")

    def records(self) -> Iterator[str]:
        # Oldest first: the keys count down, and a key's versions come newest first. One
        # GET per anchor, so several at once (a boto3 client is safe across threads).
        versions = list(reversed(list(self._versions())))
        with ThreadPoolExecutor(max_workers=_READERS) as pool:
            yield from pool.map(self._read, versions)

    def last(self) -> str | None:
        newest = next(self._versions(page_size=20), None)
        return None if newest is None else self._read(newest)

    def _call(self, operation: str, **arguments: Any) -> Any:
        # botocore came with boto3, which made ``client``: not imported for a file store.
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        try:
            return getattr(self.client, operation)(**arguments)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "an error")
            raise StoreFailed(f"the bucket refused the request ({code})") from None
        except NoCredentialsError:
            raise StoreFailed("no credentials for the bucket (AWS_ACCESS_KEY_ID and "
                              "AWS_SECRET_ACCESS_KEY, or the machine's role)") from None
        except BotoCoreError:
            raise StoreFailed("the bucket could not be reached") from None


def _s3_store(location: str, config: Mapping[str, Any]) -> S3AnchorStore:
    bucket, _, prefix = location.removeprefix("s3://").partition("/")
    if not bucket:
        raise ValueError("AUDIT_ANCHOR_PATH names no bucket: use s3://bucket/prefix")
    mode = str(config.get("AUDIT_ANCHOR_LOCK_MODE", "COMPLIANCE")).upper()
    if mode not in LOCK_MODES:
        raise ValueError(f"AUDIT_ANCHOR_LOCK_MODE is one of {', '.join(LOCK_MODES)}")
    days = config.get("AUDIT_ANCHOR_RETAIN_DAYS", 2557)
    if not isinstance(days, int) or days < 1:
        raise ValueError("AUDIT_ANCHOR_RETAIN_DAYS is a whole number of days, at least 1")
    try:  # the s3 extra: only a bucket store needs it
        import boto3
        from botocore.config import Config
    except ImportError:
        raise ValueError("an s3:// anchor store needs boto3: pip install "
                         "'orbitpilot-dashboard[s3]'") from None
    # A session of its own: credentials are looked up for this store, and boto3's shared
    # default session is not safe across threads.
    client = boto3.session.Session().client(
        "s3", endpoint_url=config.get("AUDIT_ANCHOR_S3_ENDPOINT") or None,
        config=Config(connect_timeout=5, read_timeout=15, max_pool_connections=_READERS,
                      retries={"mode": "standard", "max_attempts": 3}))
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return S3AnchorStore(client, bucket, prefix, days, mode)


def open_store(location: str, config: Mapping[str, Any] | None = None) -> AnchorStore:
    """The store ``AUDIT_ANCHOR_PATH`` names: a file path, or ``s3://bucket/prefix``."""
    if location.startswith("s3://"):
        return _s3_store(location, config or {})
    if "://" in location:
        raise ValueError(f"no anchor store for {location.split('://', 1)[0]}://; "
                         "AUDIT_ANCHOR_PATH takes a file path or s3://bucket/prefix")
    return FileAnchorStore(Path(location))
