"""Download everything about me, and a team's export (one zip: JSON, its schema, a readable
report), built by a job and downloadable for 24 hours by the person (by the team's owners
and admins); and a person's request to erase what they saved to teams."""

from dashboard.exports.models import DataExport, DataExportPart
from dashboard.exports.sections import (
    JSON_NAME,
    REPORT_NAME,
    SCHEMA_NAME,
    SECTIONS,
    TEAM_JSON_NAME,
    TEAM_SCHEMA_NAME,
    TEAM_SECTIONS,
    export_schema,
    team_export_schema,
)
from dashboard.exports.services import (
    WITHDRAWN,
    ExportGone,
    ExportNotFound,
    build_export,
    erase_team_contributions,
    export_parts,
    find_export,
    is_expired,
    latest_export,
    open_download,
    open_team_download,
    request_export,
    request_team_export,
    team_contributions,
    tend_exports,
    withdraw_exports,
)

__all__ = ["JSON_NAME", "REPORT_NAME", "SCHEMA_NAME", "SECTIONS", "TEAM_JSON_NAME",
           "TEAM_SCHEMA_NAME", "TEAM_SECTIONS", "WITHDRAWN", "DataExport", "DataExportPart",
           "ExportGone", "ExportNotFound", "build_export", "erase_team_contributions",
           "export_parts", "export_schema", "find_export", "is_expired", "latest_export",
           "open_download", "open_team_download", "request_export", "request_team_export",
           "team_contributions", "team_export_schema", "tend_exports", "withdraw_exports"]
