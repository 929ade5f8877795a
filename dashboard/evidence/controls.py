"""The one table of checks: what each measures, its area, and the criteria it evidences —
SOC 2 trust services criteria (2017, rev. 2022), ISO/IEC 27001:2022 Annex A controls and
GDPR articles. ``team`` marks what a team owner's report shows: the team's own checks
and the deployment's non-secret settings."""

from __future__ import annotations

from dataclasses import dataclass

AREAS = ("access", "data", "application", "software", "team")


@dataclass(frozen=True)
class Control:
    id: str
    area: str
    title: str
    soc2: tuple[str, ...]
    iso27001: tuple[str, ...]
    gdpr: tuple[str, ...]
    team: bool = False


CONTROLS: tuple[Control, ...] = (
    # -- access
    Control("access.passwords", "access", "Password hashing and policy",
            ("CC6.1",), ("A.5.17", "A.8.5"), ("Art. 32",)),
    Control("access.signin_throttle", "access", "Sign-in throttles, read back from the limiter",
            ("CC6.1", "CC6.6"), ("A.8.5",), ("Art. 32",), team=True),
    Control("access.session_cookies", "access", "Session cookie flags and HSTS",
            ("CC6.1", "CC6.7"), ("A.8.5", "A.8.24"), ("Art. 32",), team=True),
    Control("access.staff", "access", "Staff accounts by role",
            ("CC6.2", "CC6.3"), ("A.5.15", "A.5.18", "A.8.2"), ("Art. 32",)),
    Control("access.api_keys", "access", "API keys by scope, expiry and hard delete",
            ("CC6.1", "CC6.2"), ("A.5.15", "A.5.17", "A.8.5"), ("Art. 25", "Art. 32")),
    Control("access.oauth_pkce", "access", "OAuth: PKCE with S256 only (plain probed)",
            ("CC6.1", "CC6.6"), ("A.8.5", "A.8.26"), ("Art. 32",), team=True),
    Control("access.oauth_redirects", "access", "OAuth: exact redirect URI matching (probed)",
            ("CC6.1", "CC6.6"), ("A.8.26",), ("Art. 32",), team=True),
    Control("access.oauth_tokens", "access",
            "OAuth: refresh rotation with reuse detection, token lifetimes",
            ("CC6.1",), ("A.5.17", "A.8.5"), ("Art. 32",), team=True),
    Control("access.connected_apps", "access", "Connected apps",
            ("CC6.2", "CC6.3"), ("A.5.15", "A.5.19"), ("Art. 28", "Art. 32")),
    # -- data
    Control("data.db_role", "data", "The app's database role: no superuser, no BYPASSRLS",
            ("CC6.1", "CC6.3"), ("A.8.2", "A.8.3"), ("Art. 32",)),
    Control("data.audit_append_only", "data",
            "Audit tables: UPDATE, DELETE and TRUNCATE refused to the app (probed)",
            ("CC7.2", "CC7.3"), ("A.8.15",), ("Art. 5(2)", "Art. 30")),
    Control("data.audit_chain", "data", "Audit chain verified end to end, newest anchor matched",
            ("CC7.2", "CC7.3"), ("A.8.15", "A.8.17"), ("Art. 5(2)", "Art. 30")),
    Control("data.truth_check", "data", "The truth check's last run",
            ("CC7.1", "PI1.4"), ("A.8.16",), ("Art. 5(1)(d)", "Art. 25")),
    Control("data.retention", "data", "Retention windows", ("C1.2", "P4.2"),
            ("A.5.33", "A.8.10"), ("Art. 5(1)(e)",), team=True),
    Control("data.legal_holds", "data", "Legal holds", ("C1.2", "P4.2"), ("A.5.33",),
            ("Art. 17(3)",)),
    Control("data.erasure", "data", "Erasure receipts: probes all zero, VACUUM lag",
            ("C1.2", "P4.3"), ("A.8.10",), ("Art. 17", "Art. 5(1)(e)"), team=True),
    Control("data.backups", "data", "Backup horizon", ("A1.2", "P4.3"), ("A.8.13",),
            ("Art. 17", "Art. 32(1)(c)"), team=True),
    Control("data.drill", "data", "Deletion/export drill", ("C1.2", "P4.3", "CC7.1"),
            ("A.8.10", "A.5.34"), ("Art. 15", "Art. 17", "Art. 20")),
    # -- application
    Control("app.headers", "application", "Security headers and CSP (probed)",
            ("CC6.6", "CC6.8"), ("A.8.26", "A.8.28"), ("Art. 32",), team=True),
    Control("app.csrf", "application", "CSRF protection (probed)", ("CC6.6", "CC6.8"),
            ("A.8.26", "A.8.28"), ("Art. 32",), team=True),
    Control("app.only_post_mutates", "application", "Only POST mutates (the URL map checked)",
            ("CC6.8", "CC8.1"), ("A.8.26", "A.8.28"), ("Art. 32",), team=True),
    Control("app.limits", "application", "Body size and rate limits (probed)",
            ("A1.1", "CC6.6"), ("A.8.6", "A.8.26"), ("Art. 32(1)(b)",), team=True),
    # -- software
    Control("software.versions", "software",
            "Version, commit, Python, PostgreSQL and pgvector versions",
            ("CC8.1", "CC7.1"), ("A.8.8", "A.8.9", "A.8.32"), ("Art. 32",), team=True),
    Control("software.sbom", "software", "CycloneDX SBOM of the installed distributions",
            ("CC8.1", "CC9.2"), ("A.5.21", "A.8.8"), ("Art. 28", "Art. 32"), team=True),
    # -- a team
    Control("team.members", "team", "Members and roles", ("CC6.2", "CC6.3"),
            ("A.5.15", "A.5.18"), ("Art. 32",), team=True),
    Control("team.policies", "team", "Policies", ("CC6.1", "CC6.3"), ("A.5.15", "A.8.3"),
            ("Art. 25", "Art. 32"), team=True),
    Control("team.apps", "team", "The apps allowed to act for the team",
            ("CC6.2", "CC6.3"), ("A.5.19", "A.8.5"), ("Art. 28", "Art. 32"), team=True),
    Control("team.data_location", "team", "Where the team's data lives",
            ("C1.1", "CC6.1"), ("A.5.12", "A.8.10"), ("Art. 30", "Art. 44"), team=True),
    Control("team.drill", "team", "The team's last deletion/export drill",
            ("C1.2", "P4.3"), ("A.8.10", "A.5.34"), ("Art. 17", "Art. 20"), team=True),
)

BY_ID = {control.id: control for control in CONTROLS}


def criteria(control_id: str) -> dict[str, list[str]]:
    control = BY_ID[control_id]
    return {"soc2": list(control.soc2), "iso27001_2022": list(control.iso27001),
            "gdpr": list(control.gdpr)}
