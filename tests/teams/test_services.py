"""Teams' rules: a team's account owns its memory, members and roles, the last owner,
single-use invitations, what a caller reaches through which credential, saving and
sharing to a team, one search over a person's and their teams' memory, attribution."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from dashboard.access import Action, Credential, TeamSeat, may, reach_of
from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.auth.services import authenticate
from dashboard.memory import MemoryChunk
from dashboard.memory.embedders import HashingEmbedder
from dashboard.saved_memories import MemoryNotFound
from dashboard.saved_memories import reach as reached
from dashboard.saved_memories.models import Memory
from dashboard.teams import services as teams
from dashboard.teams.models import TeamInvitation, TeamMember
from tests.factories import build, make_key, make_team, make_user

CANARY = "CANARY-team-5c1e"


def test_a_team_is_an_account_of_its_own_that_nobody_signs_in_as(db_session):
    lead = make_user(db_session)
    team = make_team(db_session, lead, slug="pilot", name="Pilot")
    account = db_session.get(User, team.id)
    assert (account.kind, account.plan_id, account.display_name) == ("team", lead.plan_id,
                                                                     "Pilot")
    assert account.email == "pilot@teams.orbitpilot.invalid"
    assert authenticate(db_session, account.email, "!") is None
    assert teams.membership(db_session, team.id, lead.id).role == "owner"
    event = db_session.scalars(select(AuditEvent).where(AuditEvent.action == "team.create")
                               .order_by(AuditEvent.seq.desc())).first()
    assert event.owner_id == team.id and event.details == {"owner": lead.id,
                                                           "plan": lead.plan_id}


def test_a_slug_taken_is_a_form_error(db_session):
    lead = make_user(db_session)
    make_team(db_session, lead, slug="pilot")
    with pytest.raises(teams.TeamError) as refused:
        teams.create_team(db_session, creator=lead, name="Again", slug="Pilot",
                          actor=Actor.of(lead))
    assert refused.value.field == "slug"
    for bad in ("a", "-pilot", "pilot-", "pi--lot", "pilot team", "x" * 41, None, 7):
        with pytest.raises(teams.TeamError):
            teams.check_slug(bad)


@pytest.mark.parametrize(("role", "allowed"), [
    ("owner", {"read", "write", "share", "edit", "forget", "redact", "hard_delete", "invite",
               "remove", "change_role", "change_policy", "export", "audit"}),
    ("admin", {"read", "write", "share", "edit", "forget", "redact", "hard_delete", "invite",
               "remove", "change_role", "change_policy", "export", "audit"}),
    ("member", {"read", "write", "share"}),
    ("reader", {"read"}),
])
def test_what_each_role_may_do_by_default(role, allowed):
    seat = TeamSeat(1, "t", "T", role)
    assert {a.value for a in Action if may(seat, a)} == allowed
    # An author who is a member may also edit, delete and redact their own.
    authored = {a.value for a in Action if may(seat, a, author=True)}
    assert authored == allowed | ({"edit", "forget", "redact"} if role == "member" else set())


def test_policies_narrow_what_members_may_do():
    strict = TeamSeat(1, "t", "T", "member", write_policy="admins", forget_policy="admins")
    assert not may(strict, Action.WRITE) and not may(strict, Action.FORGET, author=True)
    assert not may(strict, Action.EDIT, author=True)
    assert may(TeamSeat(1, "t", "T", "admin", write_policy="admins"), Action.WRITE)


def test_the_last_owner_cannot_be_demoted_or_leave(db_session):
    lead, other = make_user(db_session), make_user(db_session)
    team = make_team(db_session, lead, members={other: "admin"})
    owner = teams.membership(db_session, team.id, lead.id)
    with pytest.raises(teams.LastOwner):
        teams.change_role(db_session, team, owner, lead.id, "admin", actor=Actor.of(lead))
    with pytest.raises(teams.LastOwner):
        teams.remove_member(db_session, team, owner, lead.id, actor=Actor.of(lead))
    admin = teams.membership(db_session, team.id, other.id)
    with pytest.raises(teams.RoleTooLow):  # an admin makes no owners
        teams.change_role(db_session, team, admin, other.id, "owner", actor=Actor.of(other))
    teams.change_role(db_session, team, owner, other.id, "owner", actor=Actor.of(lead))
    teams.remove_member(db_session, team, owner, lead.id, actor=Actor.of(lead))  # now may
    assert teams.membership(db_session, team.id, lead.id) is None
    events = db_session.scalars(select(AuditEvent).where(
        AuditEvent.owner_id == team.id, AuditEvent.action.like("team.%"))
        .order_by(AuditEvent.seq)).all()
    assert [(e.action, e.target_id, e.details) for e in events[1:]] == [
        ("team.role_change", str(other.id), {"team": team.id, "before": "admin",
                                             "after": "owner"}),
        ("team.leave", str(lead.id), {"team": team.id, "role": "owner", "policy": "keep"})]


def test_an_invitation_is_single_use_bound_to_its_email_and_expires(db_session):
    lead, invitee, stranger = (make_user(db_session) for _ in range(3))
    team = make_team(db_session, lead)
    owner = teams.membership(db_session, team.id, lead.id)
    invited = teams.invite(db_session, team, owner, email=invitee.email.upper(),
                           role="member", actor=Actor.of(lead))
    row = db_session.get(TeamInvitation, invited.invitation.id)
    assert row.token_hash == teams.hash_token(invited.token) and invited.token not in str(
        row.__dict__)
    assert row.expires_at - row.created_at == timedelta(days=7)
    with pytest.raises(teams.InvitationUnusable):
        teams.accept_invitation(db_session, invited.token, stranger, actor=Actor.of(stranger))
    member = teams.accept_invitation(db_session, invited.token, invitee,
                                     actor=Actor.of(invitee))
    assert member.role == "member"
    # The same person clicking twice gets the same membership; anyone else, nothing.
    assert teams.accept_invitation(db_session, invited.token, invitee,
                                   actor=Actor.of(invitee)).role == "member"
    late = teams.invite(db_session, team, owner, email=stranger.email, role="reader",
                        actor=Actor.of(lead),
                        now=datetime.now(UTC) - timedelta(days=8))
    with pytest.raises(teams.InvitationUnusable, match="expired"):
        teams.accept_invitation(db_session, late.token, stranger, actor=Actor.of(stranger))
    revoked = teams.invite(db_session, team, owner, email=stranger.email, role="reader",
                           actor=Actor.of(lead))
    teams.revoke_invitation(db_session, team, owner, revoked.invitation.id,
                            actor=Actor.of(lead))
    with pytest.raises(teams.InvitationUnusable, match="withdrawn"):
        teams.accept_invitation(db_session, revoked.token, stranger, actor=Actor.of(stranger))


def test_reach_follows_membership_and_the_credential(db_session):
    person, lead = make_user(db_session), make_user(db_session)
    one = make_team(db_session, lead, members={person: "member"})
    two = make_team(db_session, lead, members={person: "reader"})
    make_team(db_session, lead)  # not theirs
    assert reach_of(db_session, person.id).owner_ids == [person.id, one.id, two.id]
    assert reach_of(db_session, person.id, Credential(team_ids=())).owner_ids == [person.id]
    assert reach_of(db_session, person.id, Credential(team_ids=(two.id,))).owner_ids == [
        person.id, two.id]
    # An app a team has not approved does not act for it.
    two.app_policy = "allow_list"
    db_session.flush()
    assert reach_of(db_session, person.id, Credential(client_pk=999)).owner_ids == [
        person.id, one.id]
    # A key that lives longer than a team allows does not act for it.
    one.max_key_days = 30
    db_session.flush()
    now = datetime.now(UTC)
    assert reach_of(db_session, person.id, Credential(
        team_ids=(one.id,), key_created_at=now, key_expires_at=None)).owner_ids == [person.id]
    assert reach_of(db_session, person.id, Credential(
        team_ids=(one.id,), key_created_at=now,
        key_expires_at=now + timedelta(days=30))).owner_ids == [person.id, one.id]
    # Removed: the very next reach leaves the team out.
    db_session.delete(teams.membership(db_session, one.id, person.id))
    db_session.flush()
    assert reach_of(db_session, person.id).owner_ids == [person.id, two.id]


def test_saving_to_a_team_needs_a_writer_and_names_the_author_and_credential(db_session):
    lead, member, reader = (make_user(db_session) for _ in range(3))
    team = make_team(db_session, lead, slug="pilot",
                     members={member: "member", reader: "reader"})
    key, _ = make_key(db_session, member, name="codex-cli")
    saved = reached.save_for(db_session, reach_of(db_session, member.id), team="pilot",
                             content=f"We chose Heron for the ORM. {CANARY}",
                             source="chatgpt", actor=Actor("api_key", str(key.id)),
                             api_key_id=key.id, client_name="ChatGPT")
    memory = saved.memory
    assert (memory.owner_id, memory.author_id, memory.api_key_id) == (team.id, member.id,
                                                                     key.id)
    with pytest.raises(reached.RoleTooLow):
        reached.save_for(db_session, reach_of(db_session, reader.id), team="pilot",
                         content="no", actor=Actor.of(reader))
    stranger = make_user(db_session)
    with pytest.raises(reached.TeamNotReached) as unknown:
        reached.save_for(db_session, reach_of(db_session, stranger.id), team="pilot",
                         content="no", actor=Actor.of(stranger))
    with pytest.raises(reached.TeamNotReached) as missing:
        reached.save_for(db_session, reach_of(db_session, stranger.id), team="no-such-team",
                         content="no", actor=Actor.of(stranger))
    assert unknown.value.sentence == missing.value.sentence  # a stranger learns nothing
    # The lead sees it as the key it is, whatever the client called itself.
    attribution = reached.attribute(db_session, reach_of(db_session, lead.id),
                                    [memory])[memory.id]
    assert attribution.sentence == (f"Saved by {member.display_name} via API key "
                                    f"\u201ccodex-cli\u201d ({key.prefix}\u2026)")
    assert attribution.owner == "pilot"
    assert "ChatGPT" not in attribution.sentence
    mine = reached.attribute(db_session, reach_of(db_session, member.id), [memory])[memory.id]
    assert mine.author == "you"
    # Removed: what they saved stays, by "a former member", without their key's name.
    db_session.delete(teams.membership(db_session, team.id, member.id))
    db_session.flush()
    gone = reached.attribute(db_session, reach_of(db_session, lead.id), [memory])[memory.id]
    assert (gone.author, gone.author_id, gone.key_name) == ("a former member", None, None)


def test_sharing_copies_a_personal_memory_with_its_provenance(db_session):
    lead, member = make_user(db_session), make_user(db_session)
    team = make_team(db_session, lead, slug="pilot", members={member: "member"})
    reach = reach_of(db_session, member.id)
    own = reached.save_for(db_session, reach, content="Standup is at 9:30.",
                           actor=Actor.of(member)).memory
    shared = reached.share_to_team(db_session, reach, own.id, "pilot",
                                   actor=Actor.of(member)).memory
    assert (shared.owner_id, shared.shared_from_id, shared.content, shared.author_id) == (
        team.id, own.id, own.content, member.id)
    assert db_session.get(Memory, own.id).owner_id == member.id  # the original stays
    with pytest.raises(MemoryNotFound):  # only one's own is shared
        reached.share_to_team(db_session, reach_of(db_session, lead.id), own.id, "pilot",
                              actor=Actor.of(lead))


def test_a_team_memory_is_embedded_once_for_fifty_members(db_session):
    lead = make_user(db_session)
    people = [make_user(db_session) for _ in range(49)]
    team = make_team(db_session, lead, members={p: "member" for p in people})
    assert db_session.scalar(select(func.count()).select_from(TeamMember)
                             .where(TeamMember.team_id == team.id)) == 50
    reached.save_for(db_session, reach_of(db_session, people[0].id), team=team.slug,
                     content="The release train leaves every second Tuesday.",
                     actor=Actor.of(people[0]))
    embedded: list[str] = []

    class Tally(HashingEmbedder):
        def embed(self, texts):
            embedded.extend(texts)
            return super().embed(texts)

    for person in [lead, *people]:  # every member's own build: the team's is not theirs
        build(db_session, person, embedder=Tally())
    build(db_session, db_session.get(User, team.id), embedder=Tally())
    assert embedded == ["The release train leaves every second Tuesday."]
    assert db_session.scalar(select(func.count()).select_from(MemoryChunk)
                             .where(MemoryChunk.user_id == team.id)) == 1


def test_one_search_covers_a_person_and_their_teams_each_labelled(db_session,
                                                                  count_queries):
    lead, member = make_user(db_session), make_user(db_session)
    team = make_team(db_session, lead, slug="pilot", members={member: "member"})
    other = make_team(db_session, lead, slug="other")
    reached.save_for(db_session, reach_of(db_session, lead.id), team="pilot",
                     content="Heron is the codename of the billing rewrite.",
                     actor=Actor.of(lead))
    reached.save_for(db_session, reach_of(db_session, lead.id), team="other",
                     content="Heron tickets go to the other board.", actor=Actor.of(lead))
    reached.save_for(db_session, reach_of(db_session, member.id),
                     content="My own note: Heron demo on Friday.", actor=Actor.of(member))
    for owner_id in (member.id, team.id, other.id):
        build(db_session, db_session.get(User, owner_id))
    reach = reach_of(db_session, member.id)
    with count_queries() as q:
        hits = reached.recall_for(db_session, reach, "Heron", 5, embedder=HashingEmbedder())
    assert {h.owner_id for h in hits} == {member.id, team.id}  # never the other team's
    assert len(hits) == 2
    # The search itself is one statement (plus the saved memories' states, one more, and
    # what the person marked "not relevant" in the chat, one more).
    assert len([s for s in q.statements if "<=>" in s]) == 1
    assert q.count == 3


def test_only_an_owner_withdraws_or_replaces_an_invitation_to_be_an_owner(db_session):
    lead, deputy, invitee = (make_user(db_session) for _ in range(3))
    team = make_team(db_session, lead, members={deputy: "admin"})
    owner = teams.membership(db_session, team.id, lead.id)
    admin = teams.membership(db_session, team.id, deputy.id)
    invited = teams.invite(db_session, team, owner, email=invitee.email, role="owner",
                           actor=Actor.of(lead))
    with pytest.raises(teams.RoleTooLow, match="withdraw"):
        teams.revoke_invitation(db_session, team, admin, invited.invitation.id,
                                actor=Actor.of(deputy))
    with pytest.raises(teams.RoleTooLow, match="replace"):  # inviting the address again
        teams.invite(db_session, team, admin, email=invitee.email, role="member",
                     actor=Actor.of(deputy))
    assert db_session.get(TeamInvitation, invited.invitation.id).revoked_at is None
    assert teams.accept_invitation(db_session, invited.token, invitee,
                                   actor=Actor.of(invitee)).role == "owner"


def test_saving_or_changing_team_memory_through_a_credential_is_activity(db_session):
    """Last activity on the team page counts what a member does through the API, MCP or
    the chat too, not only its pages; reading is not activity."""
    lead, member = make_user(db_session), make_user(db_session)
    team = make_team(db_session, lead, slug="pilot", members={member: "member"})
    seat = teams.membership(db_session, team.id, member.id)
    reach = reach_of(db_session, member.id)
    saved = reached.save_for(db_session, reach, team="pilot", content="Heron ships Friday.",
                             actor=Actor.of(member)).memory
    db_session.refresh(seat)
    first = seat.last_active_at
    assert first is not None
    seat.last_active_at = first - timedelta(hours=2)
    db_session.flush()
    reached.find_for(db_session, reach, saved.id, operation="get")
    db_session.refresh(seat)
    assert seat.last_active_at == first - timedelta(hours=2)  # a read leaves it
    reached.find_for(db_session, reach, saved.id, operation="soft_delete")
    db_session.refresh(seat)
    assert seat.last_active_at > first - timedelta(hours=2)
