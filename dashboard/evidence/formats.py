"""The signed report's other forms, made from its JSON alone (so each says exactly what
the signed bytes say): OSCAL 1.2 assessment results and a printable HTML page."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from dashboard.evidence.controls import AREAS

OSCAL_VERSION = "1.2.3"
PROPS_NS = "https://orbitpilot.example/ns/evidence"
TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
KEY_PATH = "/.well-known/orbitpilot-evidence-key.pem"


def _uuid(document: dict[str, Any], *parts: str) -> str:
    return str(uuid.uuid5(uuid.UUID(document["uuid"]), "/".join(parts)))


def _props(check: dict[str, Any]) -> list[dict[str, str]]:
    props = [{"name": "area", "value": check["area"], "ns": PROPS_NS}]
    for framework, ids in check["criteria"].items():
        props += [{"name": framework.replace("_", "-"), "value": item, "ns": PROPS_NS}
                  for item in ids]
    return props


def oscal_assessment_results(document: dict[str, Any]) -> dict[str, Any]:
    """The report as OSCAL assessment results: one observation (the measurement) and one
    finding (satisfied or not) per check, each finding carrying the criteria as props."""
    generated = document["generated_at"]
    observations, findings = [], []
    for check in document["checks"]:
        observation_id = _uuid(document, "observation", check["id"])
        observations.append({
            "uuid": observation_id, "title": check["title"],
            "description": f"{check['summary']} Method: {check['method']}.",
            "methods": ["TEST"], "collected": check["measured_at"],
            "props": [{"name": "measured-status", "value": check["status"], "ns": PROPS_NS}],
        })
        findings.append({
            "uuid": _uuid(document, "finding", check["id"]), "title": check["title"],
            "description": check["summary"], "props": _props(check),
            "target": {"type": "objective-id", "target-id": check["id"],
                       "status": {"state": "satisfied" if check["passed"]
                                  else "not-satisfied"}},
            "related-observations": [{"observation-uuid": observation_id}],
        })
    scope = document["scope"]
    title = ("OrbitPilot evidence report" if scope == "deployment"
             else f"OrbitPilot evidence report: team {document['team']['slug']}")
    return {"assessment-results": {
        "uuid": _uuid(document, "assessment-results"),
        "metadata": {"title": title, "last-modified": generated,
                     "version": document["deployment"]["app_version"],
                     "oscal-version": OSCAL_VERSION},
        "import-ap": {"href": "#orbitpilot-evidence-plan"},
        "results": [{
            "uuid": _uuid(document, "result"), "title": title,
            "description": (f"{document['summary']['passed']} of "
                            f"{document['summary']['total']} checks passed, each measured "
                            "live by the product."),
            "start": generated, "end": generated,
            "reviewed-controls": {"control-selections": [{"include-all": {}}]},
            "observations": observations, "findings": findings,
        }],
    }}


_ENV = Environment(loader=FileSystemLoader(str(TEMPLATES)),
                   autoescape=select_autoescape(("html",)), trim_blocks=True,
                   lstrip_blocks=True)


def report_html(document: dict[str, Any], *, key_id: str) -> str:
    """A page a person reads in two minutes: the verdict, what failed, then each area."""
    by_area = {area: [c for c in document["checks"] if c["area"] == area] for area in AREAS}
    failing = [c for c in document["checks"] if not c["passed"]]
    return _ENV.get_template("evidence/report_print.html").render(
        doc=document, by_area={a: cs for a, cs in by_area.items() if cs}, failing=failing,
        key_id=key_id, key_path=KEY_PATH)
