"""Every model, imported in one place so Alembic and the app see the whole schema."""

from dashboard.audit.models import AuditCheckpoint, AuditEvent
from dashboard.auth.models import User
from dashboard.blinks.models import Blink
from dashboard.connectors.models import (
    ConnectorAccess,
    OAuthClient,
    OAuthCode,
    OAuthGrant,
    OAuthToken,
)
from dashboard.documents.models import Document
from dashboard.evidence.models import EvidenceDrill, EvidenceReport
from dashboard.exports.models import DataExport, DataExportPart
from dashboard.holds.models import HeldVersion, LegalHold
from dashboard.leases import MaintenanceLease
from dashboard.memory import MemoryBuild, MemoryChunk
from dashboard.orbitpilot.models import Conversation, Message, ProfileFact, ReplyRecall
from dashboard.plans.models import Plan, SourceAssignment
from dashboard.saved_memories.models import ApiKey, ForgetMarker, Memory, MemoryVersion
from dashboard.teams.models import Team, TeamApp, TeamInvitation, TeamMember

__all__ = [
    "ApiKey", "AuditCheckpoint", "AuditEvent", "Blink", "ConnectorAccess", "Conversation",
    "DataExport", "DataExportPart", "Document", "EvidenceDrill", "EvidenceReport",
    "ForgetMarker", "HeldVersion", "LegalHold",
    "MaintenanceLease",
    "Memory", "MemoryBuild", "MemoryChunk", "MemoryVersion", "Message", "OAuthClient",
    "OAuthCode", "OAuthGrant", "OAuthToken", "Plan", "ProfileFact", "ReplyRecall",
    "SourceAssignment", "Team", "TeamApp", "TeamInvitation", "TeamMember", "User",
]
