"""Teams' rules: making a team (and its account, which owns the team's memory), members
and roles, single-use invitations, policies, and the ``Reach`` of a caller. Audit events
name ids and roles only. Services flush; the edge commits."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dashboard.access import Action, Credential, Reach, TeamSeat, may, note_activity
from dashboard.audit.services import Actor, record_event
from dashboard.auth.models import User
from dashboard.auth.services import EMAIL_RE, normalise_email
from dashboard.refusals import Conflict, FieldError, Forbidden, Gone, NotFound
from dashboard.saved_memories import Receipt
from dashboard.saved_memories.reach import erase_authored
from dashboard.teams.models import (
    APP_POLICIES,
    FORGET_POLICIES,
    LEAVER_POLICIES,
    ROLES,
    WRITE_POLICIES,
    Team,
    TeamApp,
    TeamInvitation,
    TeamMember,
)

TEAM_EMAIL_DOMAIN = "teams.orbitpilot.invalid"
INVITATION_DAYS = 7
INVITATION_PREFIX = "opti_"
MAX_NAME = 120
SLUG_RE = re.compile(r"[a-z0-9][a-z0-9-]{1,38}[a-z0-9]")
# Addresses under /teams/ that are pages, not teams.
RESERVED_SLUGS = frozenset({"join"})
# The words every caller who is not a member gets, whether the team exists or not.
NO_SUCH_TEAM = "You are in no team with that name."
# The reason a leaver-policy erasure's receipts give (our words, not anyone's input).
LEAVER_ERASED = "Left the team, whose leaver policy erases what a leaver saved."


class TeamError(FieldError):
    """A value refused, with the form field it is about."""


class TeamNotFound(NotFound):
    """Unknown team, or one the caller is not a member of: the same answer for both."""

    def __init__(self) -> None:
        super().__init__(NO_SUCH_TEAM, "team")


class RoleTooLow(Forbidden):
    """A member whose role does not allow this."""


class LastOwner(Conflict):
    """The team would be left without an owner."""


class InvitationUnusable(Gone):
    """An invitation that is used, revoked, expired or for someone else."""


def _now(now: datetime | None) -> datetime:
    return now or datetime.now(UTC)


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def check_slug(slug: object) -> str:
    text = slug.strip().lower() if isinstance(slug, str) else ""
    if not SLUG_RE.fullmatch(text) or "--" in text:
        raise TeamError("Use 3 to 40 lower-case letters, digits and single hyphens, "
                        "starting and ending with a letter or digit (e.g. pilot-2026).",
                        "slug")
    if text in RESERVED_SLUGS:
        raise TeamError("That name is taken: choose another.", "slug")
    return text


def check_name(name: object) -> str:
    text = " ".join(name.split()) if isinstance(name, str) else ""
    if not text:
        raise TeamError("Give the team a name.", "name")
    if len(text) > MAX_NAME:
        raise TeamError(f"Use at most {MAX_NAME} characters.", "name")
    return text


def check_role(role: object) -> str:
    if role not in ROLES:
        raise TeamError(f"A role is one of {', '.join(ROLES)}.", "role")
    return str(role)


# -- teams ----------------------------------------------------------------------------------

def create_team(session: Session, *, creator: User, name: object, slug: object,
                actor: Actor) -> Team:
    """A new team led by ``creator`` (its owner), on the creator's plan; its account owns
    its memory. A slug taken (or taken meanwhile by a concurrent create) is a form error."""
    name, slug = check_name(name), check_slug(slug)
    if session.scalar(select(Team.id).where(Team.slug == slug)) is not None:
        raise TeamError("That name is taken: choose another.", "slug")
    account = User(email=f"{slug}@{TEAM_EMAIL_DOMAIN}", display_name=name, password_hash="!",
                   role="user", kind="team", plan_id=creator.plan_id)
    try:
        with session.begin_nested():
            session.add(account)
            session.flush()
            team = Team(id=account.id, slug=slug, name=name, created_by_id=creator.id)
            session.add(team)
            session.flush()
    except IntegrityError:
        raise TeamError("That name is taken: choose another.", "slug") from None
    session.add(TeamMember(team_id=team.id, user_id=creator.id, role="owner"))
    session.flush()
    record_event(session, action="team.create", actor=actor, owner_id=team.id,
                 target_type="team", target_id=str(team.id),
                 details={"owner": creator.id, "plan": account.plan_id})
    return team


def get_team(session: Session, slug: object) -> Team | None:
    if not isinstance(slug, str) or not SLUG_RE.fullmatch(slug):
        return None
    return session.scalars(select(Team).where(Team.slug == slug)).first()


def membership(session: Session, team_id: int, user_id: int) -> TeamMember | None:
    return session.get(TeamMember, (team_id, user_id))


def seat_of(team: Team, member: TeamMember) -> TeamSeat:
    return TeamSeat(team.id, team.slug, team.name, member.role, team.write_policy,
                    team.forget_policy)


def team_for(session: Session, user_id: int, slug: object, *,
             action: Action | str = Action.READ) -> tuple[Team, TeamMember]:
    """The team ``slug`` names and the caller's membership, if the caller's role may do
    ``action`` there. Not a member (or no such team): ``TeamNotFound``, alike; a member
    whose role may not: ``RoleTooLow``."""
    team = get_team(session, slug)
    member = membership(session, team.id, user_id) if team is not None else None
    if team is None or member is None:
        raise TeamNotFound()
    if not may(seat_of(team, member), action):
        raise RoleTooLow(f"Your role in {team.name} ({member.role}) does not allow that.")
    return team, member


def teams_of(session: Session, user_id: int) -> list[tuple[Team, TeamMember]]:
    """The user's teams, by name."""
    return [(team, member) for team, member in session.execute(
        select(Team, TeamMember).join(TeamMember, TeamMember.team_id == Team.id)
        .where(TeamMember.user_id == user_id).order_by(Team.name, Team.id))]


def members_of(session: Session, team_id: int) -> list[TeamMember]:
    """The team's members, owners first, then by when they joined."""
    order = {role: rank for rank, role in enumerate(ROLES)}
    rows = session.scalars(select(TeamMember).where(TeamMember.team_id == team_id)
                           .order_by(TeamMember.joined_at, TeamMember.user_id)).all()
    return sorted(rows, key=lambda m: order[m.role])


def touch(session: Session, team_id: int, user_id: int, *, now: datetime | None = None
          ) -> None:
    """Stamp a member's last activity in the team (at most once a minute)."""
    note_activity(session, team_id, user_id, now=_now(now))


# -- what a caller may reach ----------------------------------------------------------------

def reach_of(session: Session, user_id: int, credential: Credential) -> Reach:
    """The owners ``user_id`` may reach through ``credential``, in one query: the person,
    and each team they are a member of that the credential names and whose policies let
    it act (the app allowed, the key within the team's longest lifetime). Installed as
    ``dashboard.access``'s resolver."""
    query = (select(Team, TeamMember.role,
                    select(TeamApp.client_pk).where(TeamApp.team_id == Team.id,
                                                    TeamApp.client_pk == credential.client_pk)
                    .exists().label("app_allowed"))
             .join(TeamMember, TeamMember.team_id == Team.id)
             .where(TeamMember.user_id == user_id))
    if credential.team_ids is not None:
        if not credential.team_ids:
            return Reach(user_id)
        query = query.where(Team.id.in_(credential.team_ids))
    seats = {}
    for team, role, app_allowed in session.execute(query):
        if credential.client_pk is not None and team.app_policy != "any" and not app_allowed:
            continue
        if not key_lifetime_allowed(team, credential):
            continue
        seats[team.id] = TeamSeat(team.id, team.slug, team.name, role, team.write_policy,
                                  team.forget_policy)
    return Reach(user_id, seats)


def key_lifetime_allowed(team: Team, credential: Credential) -> bool:
    """A key may act for a team only if it ends within the team's longest lifetime."""
    if team.max_key_days is None or credential.key_created_at is None:
        return True
    return credential.key_expires_at is not None and \
        credential.key_expires_at <= credential.key_created_at + \
        timedelta(days=team.max_key_days)


# -- members and roles ----------------------------------------------------------------------

def _owners(session: Session, team_id: int) -> int:
    return session.scalar(select(func.count()).select_from(TeamMember).where(
        TeamMember.team_id == team_id, TeamMember.role == "owner")) or 0


def _lock_team(session: Session, team_id: int) -> None:
    # Role changes and removals of one team in turn: "the last owner" is then a fact,
    # not a race between two demotions.
    session.scalar(select(Team.id).where(Team.id == team_id).with_for_update())


def change_role(session: Session, team: Team, by: TeamMember, user_id: int, role: object, *,
                actor: Actor) -> TeamMember:
    """An owner or admin changes a member's role. Only an owner makes or unmakes owners;
    the last owner cannot be demoted."""
    role = check_role(role)
    if not may(seat_of(team, by), Action.CHANGE_ROLE):
        raise RoleTooLow("Only the team's owners and admins can change roles.")
    _lock_team(session, team.id)
    member = membership(session, team.id, user_id)
    if member is None:
        raise NotFound("There is no such member.", "member")
    if "owner" in (role, member.role) and by.role != "owner":
        raise RoleTooLow("Only an owner can make or unmake an owner.")
    if member.role == role:
        return member
    if member.role == "owner" and _owners(session, team.id) == 1:
        raise LastOwner("The team's last owner cannot be given another role: make "
                        "someone else an owner first.")
    before, member.role = member.role, role
    session.flush()
    record_event(session, action="team.role_change", actor=actor, owner_id=team.id,
                 target_type="team_member", target_id=str(user_id),
                 details={"team": team.id, "before": before, "after": role})
    return member


@dataclass(frozen=True)
class Removal:
    user_id: int
    role: str
    erase: bool  # the team's policy erases a leaver's contributions
    receipts: tuple[Receipt, ...] = ()  # what that erasure did, one receipt per memory


def remove_member(session: Session, team: Team, by: TeamMember, user_id: int, *,
                  actor: Actor) -> Removal:
    """An owner or admin removes a member, or a member leaves (``by`` is them). Their
    team access ends with this commit: every call computes it anew. The last owner
    cannot leave or be removed; an admin cannot remove an owner. Under the leaver policy
    "erase", what they saved to the team is hard-deleted in the same transaction, each
    with its receipt (pending under a legal hold on the team)."""
    leaving = by.user_id == user_id
    if not leaving and not may(seat_of(team, by), Action.REMOVE):
        raise RoleTooLow("Only the team's owners and admins can remove members.")
    _lock_team(session, team.id)
    member = membership(session, team.id, user_id)
    if member is None:
        raise NotFound("There is no such member.", "member")
    if member.role == "owner" and not leaving and by.role != "owner":
        raise RoleTooLow("Only an owner can remove an owner.")
    if member.role == "owner" and _owners(session, team.id) == 1:
        raise LastOwner("The team's last owner cannot leave: make someone else an owner "
                        "first.")
    role, erase = member.role, team.leaver_policy == "erase"
    session.delete(member)
    session.flush()
    receipts = tuple(erase_authored(session, team.id, user_id, actor=actor,
                                    reason=LEAVER_ERASED)) if erase else ()
    record_event(session, action="team.leave" if leaving else "team.remove", actor=actor,
                 owner_id=team.id, target_type="team_member", target_id=str(user_id),
                 details={"team": team.id, "role": role, "policy": team.leaver_policy,
                          **({"erased": len(receipts)} if erase else {})})
    return Removal(user_id, role, erase, receipts)


# -- invitations ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Invited:
    invitation: TeamInvitation
    token: str  # shown once, to copy (there is no mail server)


def invite(session: Session, team: Team, by: TeamMember, *, email: object, role: object,
           actor: Actor, now: datetime | None = None) -> Invited:
    """A single-use link for ``email``, valid for seven days; it replaces a link still
    pending for the same address. Only an owner invites an owner."""
    if not may(seat_of(team, by), Action.INVITE):
        raise RoleTooLow("Only the team's owners and admins can invite.")
    address = normalise_email(email) if isinstance(email, str) else ""
    if not EMAIL_RE.match(address) or len(address) > 254:
        raise TeamError("Enter a valid email address.", "email")
    role = check_role(role)
    if role == "owner" and by.role != "owner":
        raise RoleTooLow("Only an owner can invite an owner.")
    already = session.scalar(select(TeamMember.user_id).join(User, User.id == TeamMember.user_id)
                             .where(TeamMember.team_id == team.id, User.email == address))
    if already is not None:
        raise TeamError("That person is a member already.", "email")
    now = _now(now)
    # One live link per address: inviting again (a double click, a lost link) withdraws
    # the earlier one. The team's lock makes two at once take turns.
    _lock_team(session, team.id)
    replaced = list(session.scalars(select(TeamInvitation).where(
        TeamInvitation.team_id == team.id, TeamInvitation.email == address,
        TeamInvitation.accepted_at.is_(None), TeamInvitation.revoked_at.is_(None),
        TeamInvitation.expires_at > now)))
    if by.role != "owner" and any(earlier.role == "owner" for earlier in replaced):
        raise RoleTooLow("Only an owner can replace an invitation to be an owner.")
    for earlier in replaced:
        earlier.revoked_at = now
    raw = INVITATION_PREFIX + secrets.token_urlsafe(32)
    invitation = TeamInvitation(team_id=team.id, email=address, role=role,
                                token_hash=hash_token(raw), created_by_id=by.user_id,
                                created_at=now, expires_at=now + timedelta(days=INVITATION_DAYS))
    session.add(invitation)
    session.flush()
    # Every row written, then the audit events (the chain's lock comes last).
    for earlier in replaced:
        record_event(session, action="team.invite_revoke", actor=actor, owner_id=team.id,
                     target_type="team_invitation", target_id=str(earlier.id),
                     details={"team": team.id, "replaced_by": invitation.id})
    record_event(session, action="team.invite", actor=actor, owner_id=team.id,
                 target_type="team_invitation", target_id=str(invitation.id),
                 details={"team": team.id, "role": role,
                          "expires_at": invitation.expires_at.isoformat()})
    return Invited(invitation, raw)


def pending_invitations(session: Session, team_id: int, *, now: datetime | None = None
                        ) -> list[TeamInvitation]:
    return list(session.scalars(select(TeamInvitation).where(
        TeamInvitation.team_id == team_id, TeamInvitation.accepted_at.is_(None),
        TeamInvitation.revoked_at.is_(None), TeamInvitation.expires_at > _now(now))
        .order_by(TeamInvitation.id.desc())))


def revoke_invitation(session: Session, team: Team, by: TeamMember, invitation_id: object, *,
                      actor: Actor, now: datetime | None = None) -> TeamInvitation:
    if not may(seat_of(team, by), Action.INVITE):
        raise RoleTooLow("Only the team's owners and admins can revoke invitations.")
    try:
        invitation = session.get(TeamInvitation, int(invitation_id),  # type: ignore[arg-type]
                                 with_for_update=True)
    except (TypeError, ValueError, OverflowError):
        invitation = None
    if invitation is None or invitation.team_id != team.id:
        raise NotFound("There is no such invitation.", "invitation")
    if invitation.role == "owner" and by.role != "owner":
        raise RoleTooLow("Only an owner can withdraw an invitation to be an owner.")
    if invitation.accepted_at is None and invitation.revoked_at is None:
        invitation.revoked_at = _now(now)
        session.flush()
        record_event(session, action="team.invite_revoke", actor=actor, owner_id=team.id,
                     target_type="team_invitation", target_id=str(invitation.id),
                     details={"team": team.id})
    return invitation


def find_invitation(session: Session, raw: object, *, lock: bool = False
                    ) -> TeamInvitation | None:
    if not isinstance(raw, str) or not raw.startswith(INVITATION_PREFIX) or len(raw) > 100:
        return None
    query = select(TeamInvitation).where(TeamInvitation.token_hash == hash_token(raw))
    return session.scalars(query.with_for_update() if lock else query).first()


def invitation_problem(invitation: TeamInvitation | None, user: User | None, *,
                       now: datetime | None = None) -> str | None:
    """Why this invitation cannot be accepted by ``user`` now, in a sentence; None if it
    can. The same sentence for an unknown token and one for someone else."""
    if invitation is None or (user is not None and user.email != invitation.email):
        return ("This invitation link is not for this account: sign in as the address it "
                "was sent to, or ask for a new one.")
    if invitation.accepted_at is not None:
        return "This invitation was used already: each link works once."
    if invitation.revoked_at is not None:
        return "This invitation was withdrawn. Ask the team for a new one."
    if invitation.expires_at <= _now(now):
        return "This invitation has expired (they last seven days). Ask for a new one."
    return None


def accept_invitation(session: Session, raw: object, user: User, *, actor: Actor,
                      now: datetime | None = None) -> TeamMember:
    """``user`` (signed in as the invited address) joins with the invited role; the link
    is used up. A double click: the second finds the membership the first made."""
    now = _now(now)
    invitation = find_invitation(session, raw, lock=True)
    if invitation is not None and invitation.accepted_by_id == user.id:
        member = membership(session, invitation.team_id, user.id)
        if member is not None:
            return member
    problem = invitation_problem(invitation, user, now=now)
    if problem is not None:
        raise InvitationUnusable(problem, "invitation")
    assert invitation is not None
    invitation.accepted_at, invitation.accepted_by_id = now, user.id
    session.execute(pg_insert(TeamMember).values(
        team_id=invitation.team_id, user_id=user.id, role=invitation.role, joined_at=now)
        .on_conflict_do_nothing())
    session.flush()
    member = membership(session, invitation.team_id, user.id)
    assert member is not None
    record_event(session, action="team.join", actor=actor, owner_id=invitation.team_id,
                 target_type="team_member", target_id=str(user.id),
                 details={"team": invitation.team_id, "invitation": invitation.id,
                          "role": member.role})
    return member


# -- policies -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Policies:
    write_policy: str
    forget_policy: str
    app_policy: str
    max_key_days: int | None
    leaver_policy: str

    @classmethod
    def of(cls, team: Team) -> Policies:
        return cls(team.write_policy, team.forget_policy, team.app_policy, team.max_key_days,
                   team.leaver_policy)


def _choice(value: object, allowed: tuple[str, ...], field: str) -> str:
    if value not in allowed:
        raise TeamError("Choose one of the options.", field)
    return str(value)


def set_policies(session: Session, team: Team, by: TeamMember, *, write_policy: object,
                 forget_policy: object, app_policy: object, max_key_days: object,
                 leaver_policy: object, actor: Actor) -> Policies:
    """Owners and admins set the team's account controls; audited before/after."""
    if not may(seat_of(team, by), Action.CHANGE_POLICY):
        raise RoleTooLow("Only the team's owners and admins can change its controls.")
    days: int | None
    if max_key_days in (None, ""):
        days = None
    else:
        try:
            days = int(max_key_days)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            raise TeamError("Give a number of days (1 to 3650), or leave it empty.",
                            "max_key_days") from None
        if not 1 <= days <= 3650:
            raise TeamError("Give a number of days (1 to 3650), or leave it empty.",
                            "max_key_days")
    after = Policies(_choice(write_policy, WRITE_POLICIES, "write_policy"),
                     _choice(forget_policy, FORGET_POLICIES, "forget_policy"),
                     _choice(app_policy, APP_POLICIES, "app_policy"), days,
                     _choice(leaver_policy, LEAVER_POLICIES, "leaver_policy"))
    before = Policies.of(team)
    if after == before:
        return after
    for name, value in after.__dict__.items():
        setattr(team, name, value)
    session.flush()
    record_event(session, action="team.policy_change", actor=actor, owner_id=team.id,
                 target_type="team", target_id=str(team.id),
                 details={"before": before.__dict__, "after": after.__dict__})
    return after


def approve_app(session: Session, team: Team, by: TeamMember, client_pk: int, *,
                actor: Actor) -> bool:
    """Let a connected app act for the team (an allow-list entry or an approval)."""
    if not may(seat_of(team, by), Action.CHANGE_POLICY):
        raise RoleTooLow("Only the team's owners and admins can allow apps.")
    # RETURNING, not rowcount (which the driver may leave at -1): a row back is a row added.
    added = session.execute(pg_insert(TeamApp).values(
        team_id=team.id, client_pk=client_pk, approved_by_id=by.user_id)
        .on_conflict_do_nothing().returning(TeamApp.team_id)).first() is not None
    if added:
        record_event(session, action="team.app_allow", actor=actor, owner_id=team.id,
                     target_type="oauth_client", target_id=str(client_pk),
                     details={"team": team.id})
    return added


def disallow_app(session: Session, team: Team, by: TeamMember, client_pk: int, *,
                 actor: Actor) -> bool:
    if not may(seat_of(team, by), Action.CHANGE_POLICY):
        raise RoleTooLow("Only the team's owners and admins can disallow apps.")
    row = session.get(TeamApp, (team.id, client_pk))
    if row is None:
        return False
    session.delete(row)
    session.flush()
    record_event(session, action="team.app_disallow", actor=actor, owner_id=team.id,
                 target_type="oauth_client", target_id=str(client_pk),
                 details={"team": team.id})
    return True


def allowed_apps(session: Session, team_id: int) -> list[TeamApp]:
    return list(session.scalars(select(TeamApp).where(TeamApp.team_id == team_id)
                                .order_by(TeamApp.approved_at)))
