"""The report's forms: signed and checkable offline (``flask evidence verify``, openssl),
one changed byte failing; the OSCAL output valid against NIST's published schema; the
SBOM read back by the CycloneDX library; the JSON valid against its own schema."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import regex
from cyclonedx.model.bom import Bom
from jsonschema import Draft7Validator, Draft202012Validator, FormatChecker

from dashboard.evidence.formats import oscal_assessment_results
from dashboard.evidence.models import EvidenceReport
from dashboard.evidence.signing import canonical_bytes
from dashboard.evidence.web import signing_key

DATA = Path(__file__).resolve().parent / "data"
OSCAL_SCHEMA = json.loads((DATA / "oscal_assessment-results_schema.json").read_text())
REPORT_SCHEMA = json.loads((Path(__file__).resolve().parents[2]
                            / "dashboard/evidence/report_schema.json").read_text())


def _pattern(validator, pattern, instance, schema):
    # The OSCAL schema's patterns use \p{L} and \p{N}: matched with the regex module,
    # which reads them (Python's re cannot compile them at all).
    if validator.is_type(instance, "string") and not regex.search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


OscalValidator = jsonschema.validators.extend(Draft7Validator, {"pattern": _pattern})


def oscal_errors(document: dict) -> list[str]:
    validator = OscalValidator(OSCAL_SCHEMA, format_checker=FormatChecker())
    return [error.message for error in validator.iter_errors(document)]


@pytest.fixture(scope="module")
def written(app, tmp_path_factory):
    """One deployment report written by ``flask evidence report`` (its rows rolled back)."""
    from tests.conftest import _TestScopedSession

    out = tmp_path_factory.mktemp("evidence")
    with app.app_context():
        from sqlalchemy.orm import sessionmaker

        from dashboard.extensions import db

        connection = db.engine.connect()
        transaction = connection.begin()
        original = db.session
        db.session = _TestScopedSession(sessionmaker(bind=connection,
                                                     join_transaction_mode="create_savepoint"))
        try:
            result = app.test_cli_runner().invoke(args=["evidence", "report", "--out",
                                                        str(out)])
        finally:
            db.session.end()
            transaction.rollback()
            connection.close()
            db.session = original
    assert "passed" in result.output, result.output
    return out, result


def verify_cli(app, *args):
    return app.test_cli_runner().invoke(args=["evidence", "verify", *args])


def test_the_report_command_writes_every_form_and_exits_1_on_a_failed_check(written):
    out, result = written
    assert sorted(p.name for p in out.iterdir()) == [
        "evidence-key.pem", "report.html", "report.json", "report.json.sig",
        "report.oscal.json", "report.oscal.json.sig"]
    document = json.loads((out / "report.json").read_bytes())
    # A test database has never run the truth check or a drill: those fail, so exit 1.
    assert document["summary"]["failed"] >= 2 and result.exit_code == 1


def test_the_signed_report_verifies_and_one_changed_byte_fails(app, written, tmp_path):
    out, _ = written
    ok = verify_cli(app, str(out / "report.json"), "--key", str(out / "evidence-key.pem"))
    assert ok.exit_code == 0, ok.output
    assert ok.output.startswith("OK: report.json is signed by key ")
    changed = tmp_path / "report.json"
    data = bytearray((out / "report.json").read_bytes())
    data[len(data) // 2] ^= 0x01
    changed.write_bytes(bytes(data))
    shutil.copy(out / "report.json.sig", tmp_path / "report.json.sig")
    failed = verify_cli(app, str(changed), "--key", str(out / "evidence-key.pem"))
    assert failed.exit_code == 1
    assert failed.output.startswith("FAILED: report.json does not match its signature")


def test_another_key_fails_verification(app, written, tmp_path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from dashboard.evidence.signing import public_pem

    out, _ = written
    other = tmp_path / "other.pem"
    other.write_text(public_pem(Ed25519PrivateKey.generate().public_key()))
    assert verify_cli(app, str(out / "report.json"), "--key", str(other)).exit_code == 1


def test_the_oscal_form_is_signed_too(app, written):
    out, _ = written
    result = verify_cli(app, str(out / "report.oscal.json"))  # the deployment's own key
    assert result.exit_code == 0, result.output


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_the_openssl_recipe_verifies_and_refuses_a_changed_byte(written, tmp_path):
    out, _ = written
    recipe = ["openssl", "pkeyutl", "-verify", "-pubin", "-inkey",
              str(out / "evidence-key.pem"), "-rawin", "-in", None, "-sigfile",
              str(out / "report.json.sig")]
    good = subprocess.run([*recipe[:8], str(out / "report.json"), *recipe[9:]],
                          capture_output=True, text=True, timeout=30)
    assert good.returncode == 0 and "Signature Verified Successfully" in good.stdout
    data = bytearray((out / "report.json").read_bytes())
    data[10] ^= 0x01
    (tmp_path / "changed.json").write_bytes(bytes(data))
    bad = subprocess.run([*recipe[:8], str(tmp_path / "changed.json"), *recipe[9:]],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0


def test_the_oscal_output_validates_against_the_official_schema(written):
    out, _ = written
    oscal = json.loads((out / "report.oscal.json").read_bytes())
    assert OSCAL_SCHEMA["$id"] == "http://csrc.nist.gov/ns/oscal/1.2.3/oscal-ar-schema.json"
    assert oscal_errors(oscal) == []
    findings = oscal["assessment-results"]["results"][0]["findings"]
    document = json.loads((out / "report.json").read_bytes())
    assert {f["target"]["target-id"]: f["target"]["status"]["state"] for f in findings} == {
        c["id"]: "satisfied" if c["passed"] else "not-satisfied" for c in document["checks"]}


def test_the_oscal_validation_is_real(written):
    """The same validator refuses a finding without its status and a target id that
    breaks the schema's \\p{L} token pattern."""
    out, _ = written
    oscal = json.loads((out / "report.oscal.json").read_bytes())
    finding = oscal["assessment-results"]["results"][0]["findings"][0]
    del finding["target"]["status"]
    assert any("'status' is a required property" in e for e in oscal_errors(oscal))
    oscal = json.loads((out / "report.oscal.json").read_bytes())
    oscal["assessment-results"]["results"][0]["findings"][0]["target"]["target-id"] = "9 x"
    assert any("does not match" in e for e in oscal_errors(oscal))


def test_the_sbom_parses_with_the_cyclonedx_library(written):
    out, _ = written
    sbom = json.loads((out / "report.json").read_bytes())["sbom"]
    bom = Bom.from_json(sbom)
    names = {component.name.lower() for component in bom.components}
    assert {"flask", "sqlalchemy", "cryptography", "cyclonedx-python-lib"} <= names
    assert bom.metadata.component.name == "orbitpilot-dashboard"


def test_the_report_is_valid_against_its_json_schema(written):
    out, _ = written
    document = json.loads((out / "report.json").read_bytes())
    Draft202012Validator(REPORT_SCHEMA, format_checker=FormatChecker()).validate(document)
    assert (out / "report.json").read_bytes() == canonical_bytes(document)


def test_each_check_is_mapped_to_the_three_frameworks(written):
    out, _ = written
    for check in json.loads((out / "report.json").read_bytes())["checks"]:
        assert check["criteria"]["soc2"] and check["criteria"]["iso27001_2022"] \
            and check["criteria"]["gdpr"], check["id"]
        assert all(item.startswith("A.") for item in check["criteria"]["iso27001_2022"])


def test_the_public_key_is_served_at_the_well_known_url(app, client, db_session):
    from sqlalchemy import func, select

    before = db_session.scalar(select(func.count()).select_from(EvidenceReport))
    response = client.get("/.well-known/orbitpilot-evidence-key.pem")
    assert response.status_code == 200
    assert response.get_data(as_text=True) == signing_key(app).public_pem()
    assert client.get("/evidence/report-schema.json").json == REPORT_SCHEMA
    assert db_session.scalar(select(func.count()).select_from(EvidenceReport)) == before


def test_oscal_of_a_team_report_names_the_team(written):
    out, _ = written
    document = json.loads((out / "report.json").read_bytes())
    document["scope"], document["team"] = "team", {"slug": "pilot"}
    title = oscal_assessment_results(document)["assessment-results"]["metadata"]["title"]
    assert title == "OrbitPilot evidence report: team pilot"


def test_a_signing_key_that_is_no_key_stops_the_start(monkeypatch, tmp_path):
    from dashboard.config import SettingError, settings_from_env

    monkeypatch.setenv("EVIDENCE_SIGNING_KEY", "not-a-key")
    with pytest.raises(SettingError, match="EVIDENCE_SIGNING_KEY"):
        settings_from_env(tmp_path)


def test_a_given_signing_key_signs(monkeypatch, tmp_path):
    from dashboard.config import settings_from_env
    from dashboard.evidence.signing import SigningKey, verify

    monkeypatch.setenv("EVIDENCE_SIGNING_KEY", "11" * 32)
    key = SigningKey.from_setting(settings_from_env(tmp_path)["EVIDENCE_SIGNING_KEY"])
    assert verify(key.public, b"report", key.sign(b"report"))
    assert not (tmp_path / "evidence_signing_key").exists()


def test_the_report_command_makes_a_teams_part(runner, db_session, tmp_path):
    from tests.factories import make_team, make_user

    team = make_team(db_session, make_user(db_session), slug="cli-team", name="CLI team")
    result = runner.invoke(args=["evidence", "report", "--team", "cli-team", "--out",
                                 str(tmp_path)])
    assert "passed" in result.output, result.output
    document = json.loads((tmp_path / "report.json").read_bytes())
    assert (document["scope"], document["team"]["id"]) == ("team", team.id)
    assert oscal_errors(json.loads((tmp_path / "report.oscal.json").read_bytes())) == []
    missing = runner.invoke(args=["evidence", "report", "--team", "nope"])
    assert missing.exit_code == 1 and "No team has the slug 'nope'." in missing.output
