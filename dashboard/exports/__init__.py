"""Download everything about me (one zip: JSON, its schema, a readable report), built by
a job and downloadable by its owner for 24 hours."""

from dashboard.exports.models import DataExport, DataExportPart
from dashboard.exports.services import (
    JSON_NAME,
    REPORT_NAME,
    SCHEMA_NAME,
    SECTIONS,
    WITHDRAWN,
    ExportGone,
    ExportNotFound,
    build_export,
    export_parts,
    export_schema,
    find_export,
    is_expired,
    latest_export,
    open_download,
    request_export,
    tend_exports,
    withdraw_exports,
)

__all__ = ["JSON_NAME", "REPORT_NAME", "SCHEMA_NAME", "SECTIONS", "WITHDRAWN", "DataExport",
           "DataExportPart", "ExportGone", "ExportNotFound", "build_export", "export_parts",
           "export_schema", "find_export", "is_expired", "latest_export", "open_download",
           "request_export", "tend_exports", "withdraw_exports"]
