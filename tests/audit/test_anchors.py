"""Audit tail anchoring: each checkpoint is also signed with a key the database does not
hold and appended to a file outside it, so a log cut short — its checkpoint rows deleted
too, by an owner who switched the guard off — still fails ``flask audit verify``, and so
does an anchor file that was altered.

The tampering runs in the owner's rolled-back transaction (``owner_session``); each test
has an anchor file of its own (tests/conftest.py)."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

import pytest
from sqlalchemy import text

from dashboard.extensions import db
from tests.audit.test_chain import DISABLE_GUARD, head, record, rehash
from tests.conftest import TEST_ANCHOR_KEY

DISABLE_CHECKPOINT_GUARD = ("ALTER TABLE audit_checkpoints DISABLE TRIGGER "
                            "audit_checkpoints_no_update_delete")


def cli(runner, session, *args: str) -> tuple[int, str]:
    """``flask audit ...`` through ``session`` (it sees the test's uncommitted rows)."""
    original = db.session
    db.session = session
    try:
        result = runner.invoke(args=["audit", *args])
    finally:
        db.session = original
    return result.exit_code, result.output.strip()


def anchor_file(app) -> Path:
    return Path(app.config["AUDIT_ANCHOR_PATH"])


def anchors(app) -> list[dict]:
    return [json.loads(line) for line in anchor_file(app).read_text().splitlines()]


def signature(fields: dict) -> str:
    body = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(TEST_ANCHOR_KEY.encode(), body, hashlib.sha256).hexdigest()


def cut_tail(session, events: int) -> int:
    """What a tampering owner does: the guards off, the last ``events`` events and every
    checkpoint row deleted. The seq the log now ends at."""
    session.execute(text(DISABLE_GUARD))
    session.execute(text(DISABLE_CHECKPOINT_GUARD))
    last = session.scalar(text("SELECT max(seq) FROM audit_events"))
    session.execute(text("DELETE FROM audit_events WHERE seq > :seq"),
                    {"seq": last - events})
    session.execute(text("DELETE FROM audit_checkpoints"))
    return last - events


# -- writing --------------------------------------------------------------------------------

def test_a_checkpoint_is_signed_and_appended_to_a_file_outside_the_database(app, runner,
                                                                            db_session):
    events = record(db_session, 2)
    exit_code, output = cli(runner, db_session, "checkpoint")
    assert exit_code == 0
    path = anchor_file(app)
    assert output.splitlines() == [
        f"Checkpoint at seq {events[-1].seq}: {events[-1].hash}",
        f"Signed anchor of seq {events[-1].seq} appended to {path}.",
    ]
    (anchor,) = anchors(app)
    assert (anchor["seq"], anchor["hash"]) == (events[-1].seq, events[-1].hash)
    fields = {name: value for name, value in anchor.items() if name != "sig"}
    assert set(fields) == {"seq", "hash", "signed_at", "chain"}
    assert anchor["chain"] == str(db_session.scalar(text("SELECT chain_id FROM audit_chain")))
    assert anchor["sig"] == signature(fields)  # HMAC-SHA256 with the anchor key
    # Nothing new: nothing appended.
    assert cli(runner, db_session, "checkpoint") == (
        0, "No new events since the last checkpoint.")
    assert len(anchors(app)) == 1
    (later,) = record(db_session, 1)
    cli(runner, db_session, "checkpoint")
    assert [(a["seq"], a["hash"]) for a in anchors(app)] == [
        (events[-1].seq, events[-1].hash), (later.seq, later.hash)]


def test_verify_says_which_anchors_it_matched(app, runner, db_session):
    events = record(db_session, 2)
    db_session.commit()  # verify rolls back what it read through: keep the events
    assert cli(runner, db_session, "verify")[1].endswith(
        f"no anchor yet in {anchor_file(app)}.")
    cli(runner, db_session, "checkpoint")
    exit_code, output = cli(runner, db_session, "verify")
    assert exit_code == 0
    assert output.startswith("OK: ")
    assert output.endswith(f", 1 signed anchor(s) matched (the newest: seq {events[-1].seq}, "
                           f"in {anchor_file(app)}).")


# -- another database's anchors --------------------------------------------------------------

OTHER_CHAIN = "5f0c2a4e-0000-4000-8000-00000000beef"


def write_anchor(app, seq: int, head_hash: str, chain: str | None) -> None:
    fields = {"seq": seq, "hash": head_hash, "signed_at": "2026-11-01T00:00:00.000000Z"}
    if chain is not None:
        fields["chain"] = chain
    with anchor_file(app).open("a") as out:
        out.write(json.dumps({**fields, "sig": signature(fields)}) + "\n")


def test_an_earlier_databases_anchors_are_named_as_such_not_as_a_cut(app, runner,
                                                                      db_session):
    """A fresh database beside the anchor file an earlier one wrote (further along):
    its anchors are another chain's, said so, and this database anchors its own."""
    write_anchor(app, 99_999_999, "ab" * 32, OTHER_CHAIN)
    events = record(db_session, 2)
    db_session.commit()  # verify rolls back what it read through: keep the events
    exit_code, output = cli(runner, db_session, "verify")
    assert exit_code == 0
    assert output.splitlines() == [
        output.splitlines()[0],
        f"NOTE: {anchor_file(app)} also holds 1 anchor(s) of another database (chain "
        f"{OTHER_CHAIN} up to seq 99999999): not this database's, so not checked against "
        "its log."]
    assert output.splitlines()[0].startswith("OK: ")
    assert output.splitlines()[0].endswith(f"no anchor yet in {anchor_file(app)}.")
    # Its newest anchor is further along, but it is not this chain's: ours is written.
    assert cli(runner, db_session, "checkpoint")[1].endswith(
        f"Signed anchor of seq {events[-1].seq} appended to {anchor_file(app)}.")
    exit_code, output = cli(runner, db_session, "verify")
    assert exit_code == 0
    assert f"1 signed anchor(s) matched (the newest: seq {events[-1].seq}" in output


def test_an_anchor_written_before_chains_had_an_identity_still_catches_a_cut(
        app, runner, owner_session):
    seqs = [event.seq for event in record(owner_session, 4)]
    last = owner_session.scalar(text("SELECT hash FROM audit_events WHERE seq = :s"),
                                {"s": seqs[-1]})
    write_anchor(app, seqs[-1], last, None)
    owner_session.commit()  # verify rolls back what it read through: keep the events
    assert cli(runner, owner_session, "verify")[0] == 0
    end = cut_tail(owner_session, 2)
    exit_code, output = cli(runner, owner_session, "verify")
    assert exit_code == 1
    assert f"it was cut short after seq {end}" in output


def test_the_chain_identity_cannot_be_changed(owner_session):
    from sqlalchemy.exc import DBAPIError
    with pytest.raises(DBAPIError, match="audit_chain is fixed"), owner_session.begin_nested():
        owner_session.execute(text("UPDATE audit_chain SET chain_id = gen_random_uuid()"))


# -- a log cut short ------------------------------------------------------------------------

def test_a_log_cut_short_with_its_checkpoint_rows_is_caught_by_the_anchor(runner,
                                                                          owner_session):
    """The acceptance test of issue 15: as the owner, the last 3 events and every
    checkpoint row deleted; verify exits 1 and names the cut."""
    seqs = [event.seq for event in record(owner_session, 5)]
    assert cli(runner, owner_session, "checkpoint")[0] == 0
    assert cli(runner, owner_session, "verify")[0] == 0
    end = cut_tail(owner_session, 3)
    assert end == seqs[1]
    exit_code, output = cli(runner, owner_session, "verify")
    assert exit_code == 1
    assert output == (f"BROKEN at seq {end + 1}: the newest anchor (signed, outside the "
                      f"database) names seq {seqs[-1]}, but the log ends at seq {end}: it "
                      f"was cut short after seq {end}")


def test_a_log_cut_short_then_grown_again_is_caught_at_the_anchor_it_passed(runner,
                                                                          owner_session):
    """Cut, then new events past the anchor and a new anchor of them: the older anchor
    still names a hash the chain no longer has."""
    anchored_seq = record(owner_session, 3)[-1].seq
    cli(runner, owner_session, "checkpoint")
    cut_tail(owner_session, 2)
    record(owner_session, 4, action="test.after_cut")
    cli(runner, owner_session, "checkpoint")
    assert len(anchors(runner.app)) == 2
    replaced = owner_session.execute(text("SELECT id FROM audit_events WHERE seq = :seq"),
                                     {"seq": anchored_seq}).scalar()
    exit_code, output = cli(runner, owner_session, "verify")
    assert exit_code == 1
    assert output == (f"BROKEN at event id {replaced} (seq {anchored_seq}): it differs "
                      "from the signed anchor written for it")


def test_a_rewritten_chain_is_caught_by_the_anchor_when_the_checkpoints_are_gone(
        runner, owner_session):
    events = record(owner_session, 3)
    cli(runner, owner_session, "checkpoint")
    owner_session.execute(text(DISABLE_GUARD))
    owner_session.execute(text(DISABLE_CHECKPOINT_GUARD))
    owner_session.execute(text("DELETE FROM audit_checkpoints"))
    owner_session.execute(text("UPDATE audit_events SET actor_id = '2' WHERE id = :id"),
                          {"id": events[1].id})
    prev = events[0].hash
    for event in events[1:]:
        prev = rehash(owner_session, event.id, prev)
    exit_code, output = cli(runner, owner_session, "verify")
    assert exit_code == 1
    assert output == (f"BROKEN at event id {events[-1].id} (seq {events[-1].seq}): it "
                      "differs from the signed anchor written for it")


# -- a tampered anchor file -----------------------------------------------------------------

def lower_seq(anchor: dict) -> str:
    """What a tamperer without the key would need: the anchor moved down to the cut."""
    return json.dumps({**anchor, "seq": anchor["seq"] - 3})


TAMPERINGS = {
    "seq moved down": lower_seq,
    "hash changed": lambda a: json.dumps({**a, "hash": "f" * 64}),
    "signature dropped": lambda a: json.dumps({k: v for k, v in a.items() if k != "sig"}),
    "not an anchor": lambda a: "{\"seq\": ",
}


@pytest.mark.parametrize("tamper", TAMPERINGS.values(), ids=TAMPERINGS.keys())
def test_a_tampered_anchor_file_fails_verify(app, runner, owner_session, tamper):
    record(owner_session, 5)
    cli(runner, owner_session, "checkpoint")
    path = anchor_file(app)
    (anchor,) = anchors(app)
    path.write_text(tamper(anchor) + "\n")
    cut_tail(owner_session, 3)
    exit_code, output = cli(runner, owner_session, "verify")
    assert exit_code == 1
    assert f"BROKEN anchors: line 1 of {path} " in output


def test_an_anchor_forged_without_the_key_fails_verify(app, runner, db_session):
    events = record(db_session, 2)
    cli(runner, db_session, "checkpoint")
    forged = {"seq": events[0].seq, "hash": events[0].hash, "signed_at": "2026-01-01T00:00:00"
              ".000000+00:00", "sig": "0" * 64}
    with anchor_file(app).open("a") as fh:
        fh.write(json.dumps(forged) + "\n")
    exit_code, output = cli(runner, db_session, "verify")
    assert exit_code == 1
    assert output.startswith(f"BROKEN anchors: line 2 of {anchor_file(app)} is not signed "
                             "with the anchor key")


def test_a_verifier_with_another_key_reports_the_anchors(app, runner, db_session,
                                                          monkeypatch):
    record(db_session, 1)
    cli(runner, db_session, "checkpoint")
    monkeypatch.setitem(app.config, "AUDIT_ANCHOR_KEY", "another key")
    exit_code, output = cli(runner, db_session, "verify")
    assert exit_code == 1
    assert f"BROKEN anchors: line 1 of {anchor_file(app)} is not signed with the anchor " \
           "key" in output


def test_a_torn_line_is_reported_and_the_anchors_after_it_still_count(app, runner,
                                                                      owner_session):
    path = anchor_file(app)
    path.write_text('{"seq": 1, "ha')  # a write cut off midway, without its newline
    seqs = [event.seq for event in record(owner_session, 4)]
    cli(runner, owner_session, "checkpoint")
    assert path.read_text().splitlines()[0] == '{"seq": 1, "ha'
    end = cut_tail(owner_session, 2)
    exit_code, output = cli(runner, owner_session, "verify")
    assert exit_code == 1
    assert output.splitlines() == [
        f"BROKEN at seq {end + 1}: the newest anchor (signed, outside the database) names "
        f"seq {seqs[-1]}, but the log ends at seq {end}: it was cut short after seq {end}",
        f"BROKEN anchors: line 1 of {path} is not an anchor (a JSON object of seq, hash, "
        "signed_at, chain and sig)",
    ]


# -- what stays as it was -------------------------------------------------------------------

def test_expect_still_checks_a_head_kept_elsewhere(runner, db_session):
    events = record(db_session, 2)
    db_session.commit()  # verify rolls back what it read through: keep the events
    seq, head_hash = head(db_session)
    assert cli(runner, db_session, "verify", "--expect", f"{seq}:{head_hash}")[0] == 0
    exit_code, output = cli(runner, db_session, "verify", "--expect",
                            f"{events[0].seq}:{'a' * 64}")
    assert exit_code == 1
    assert output == (f"BROKEN at event id {events[0].id} (seq {events[0].seq}): it "
                      "differs from the checkpoint written for it")


# -- settings -------------------------------------------------------------------------------

def test_the_key_is_generated_once_into_the_instance_folder_unless_given(monkeypatch,
                                                                         tmp_path):
    from dashboard.config import settings_from_env

    for name in ("AUDIT_ANCHOR_KEY", "AUDIT_ANCHOR_PATH", "SECRET_KEY"):
        monkeypatch.delenv(name, raising=False)
    first = settings_from_env(tmp_path)
    key_file = tmp_path / "audit_anchor_key"
    assert first["AUDIT_ANCHOR_KEY"] == key_file.read_text()
    assert len(first["AUDIT_ANCHOR_KEY"]) == 64
    assert first["AUDIT_ANCHOR_KEY"] != first["SECRET_KEY"]
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert settings_from_env(tmp_path)["AUDIT_ANCHOR_KEY"] == first["AUDIT_ANCHOR_KEY"]
    assert first["AUDIT_ANCHOR_PATH"] == str(tmp_path / "audit" / "anchors.jsonl")
    monkeypatch.setenv("AUDIT_ANCHOR_KEY", "a key kept elsewhere")
    monkeypatch.setenv("AUDIT_ANCHOR_PATH", "/mnt/worm/anchors.jsonl")
    given = settings_from_env(tmp_path)
    assert (given["AUDIT_ANCHOR_KEY"], given["AUDIT_ANCHOR_PATH"]) == (
        "a key kept elsewhere", "/mnt/worm/anchors.jsonl")
