"""Demo data for ``flask seed-demo``: three plans, users on each, staff, a little content,
and the team Pilot (led by the Team plan's user, two members, a few team memories saved
through an API key, a registered app and the pages, so attribution shows at once)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session
from werkzeug.security import generate_password_hash

from dashboard.access import Credential, reach_of
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.auth.services import create_user, get_user_by_email
from dashboard.blinks.models import Blink
from dashboard.connectors import services as connections
from dashboard.documents.models import Document
from dashboard.orbitpilot.models import Conversation, Message, ProfileFact
from dashboard.plans.models import Plan, SourceAssignment
from dashboard.saved_memories.keys import create_key
from dashboard.saved_memories.models import Memory
from dashboard.saved_memories.reach import save_for
from dashboard.teams.models import Team, TeamMember
from dashboard.teams.services import create_team

DEMO_PASSWORD = "orbit-demo-2026"

PLANS = (
    # slug, name, cap, price, description, assignments
    ("free", "Free", 3, 0, "Untouched defaults: chat history is evicted by the cap.", {}),
    ("plus", "Plus", 5, 900, "A larger cap: every default source fits.", {}),
    ("team", "Team", 3, 1900, "Blinks switched off, so chat history fits in the cap.",
     {"blink.blinks": False}),
)

USERS = (
    # email, name, role, plan slug
    ("free@demo.orbitpilot.test", "Fran Free", "user", "free"),
    ("plus@demo.orbitpilot.test", "Pat Plus", "user", "plus"),
    ("team@demo.orbitpilot.test", "Tess Team", "user", "team"),
    ("support@demo.orbitpilot.test", "Sam Support", "support", "free"),
    ("admin@demo.orbitpilot.test", "Ada Admin", "admin", "plus"),
)


# The pilot team: slug, name, its lead, and each member with their role.
TEAM_SLUG, TEAM_NAME = "pilot", "Pilot"
TEAM_LEAD = "team@demo.orbitpilot.test"
TEAM_MEMBERS = (("plus@demo.orbitpilot.test", "member"), ("free@demo.orbitpilot.test", "reader"))
# A registered app as a connector registers itself; the demo's is called "Claude".
DEMO_APP = {"client_name": "Claude", "redirect_uris": ["http://127.0.0.1:33418/callback"],
            "token_endpoint_auth_method": "none"}
DEMO_APP_RESOURCE = "http://127.0.0.1:5000/mcp"


@dataclass(frozen=True)
class SeededUser:
    email: str
    role: str
    plan: str
    created: bool


def seed_demo(session: Session, password: str = DEMO_PASSWORD) -> list[SeededUser]:
    """Idempotent: running it twice changes nothing the first run made."""
    plans: dict[str, Plan] = {}
    for slug, name, cap, price, description, assignments in PLANS:
        plan = session.scalars(select(Plan).where(Plan.slug == slug)).first()
        if plan is None:
            plan = Plan(slug=slug, name=name, included_sources=cap,
                        monthly_price_cents=price, description=description,
                        is_default=False)
            session.add(plan)
            session.flush()
            for key, enabled in assignments.items():
                session.add(SourceAssignment(plan_id=plan.id, source_key=key, enabled=enabled))
        plans[slug] = plan
    session.flush()

    password_hash = generate_password_hash(password)
    seeded: list[SeededUser] = []
    for email, name, role, plan_slug in USERS:
        user = get_user_by_email(session, email)
        created = user is None
        if user is None:
            plan = plans[plan_slug]
            user = create_user(
                session, email=email, password=password, display_name=name, role=role,
                # Free users stay on "no plan": the default plan, as a real sign-up would.
                plan=None if plan.is_default else plan, password_hash=password_hash,
            )
            _seed_content(session, user)
        seeded.append(SeededUser(email, role, plan_slug, created))
    session.flush()
    _seed_team(session)
    return seeded


def describe_seeded(seeded: list[SeededUser], password: str) -> list[str]:
    """The lines the run command and ``flask seed-demo`` print for the person at the
    keyboard (a demo-only password)."""
    return [f"Demo accounts (password for all: {password}):"] + [
        f"  {user.role:<8} {user.plan:<5} {user.email}  [{'created' if user.created else 'exists'}]"
        for user in seeded
    ] + [f"Demo team: {TEAM_NAME} (/teams/{TEAM_SLUG}), led by {TEAM_LEAD}; "
         + ", ".join(f"{email} ({role})" for email, role in TEAM_MEMBERS)]


def _seed_team(session: Session) -> None:
    """The team Pilot, once: its lead (the Team plan's user, so the team's account is on
    the Team plan), a member and a reader, and three team memories — saved by the member
    with the API key "codex-cli", by the lead through the registered app "Claude", and by
    the lead on the pages — made through the services (audited, a build requested)."""
    if session.scalar(select(Team.id).where(Team.slug == TEAM_SLUG)) is not None:
        return
    lead = get_user_by_email(session, TEAM_LEAD)
    members = [(get_user_by_email(session, email), role) for email, role in TEAM_MEMBERS]
    if lead is None or any(user is None for user, _ in members):
        return
    team = create_team(session, creator=lead, name=TEAM_NAME, slug=TEAM_SLUG,
                       actor=Actor.of(lead))
    for user, role in members:
        session.add(TeamMember(team_id=team.id, user_id=user.id, role=role))
    session.flush()
    member = members[0][0]
    key, _ = create_key(session, owner=member, name="codex-cli",
                        scopes=["memory:read", "memory:write"], actor=Actor.of(member))
    key.team_ids = [team.id]
    client, _ = connections.register_client(session, DEMO_APP)
    grant = connections.consent(session, user=lead, client=client,
                                scopes=["memory:read", "memory:write"],
                                resource=DEMO_APP_RESOURCE, allowed=True)
    if grant is not None:  # allowed: the live connection, naming the team
        grant.team_ids = [team.id]
    session.flush()
    save_for(session, reach_of(session, member.id, Credential(team_ids=(team.id,))),
             team=TEAM_SLUG, source="codex",
             content="Heron is the codename of the billing rewrite; it ships behind the "
                     "heron_billing flag.",
             actor=Actor("api_key", str(key.id)), api_key_id=key.id)
    save_for(session, reach_of(session, lead.id, Credential(team_ids=(team.id,),
                                                            client_pk=client.id)),
             team=TEAM_SLUG, source="claude",
             content="The release train leaves every second Tuesday; the Friday before "
                     "is code freeze.",
             actor=Actor("connector", str(grant.id if grant else client.id)),
             oauth_client_pk=client.id,
             client_name="Claude")
    save_for(session, reach_of(session, lead.id), team=TEAM_SLUG, source="orbitpilot",
             content="Pilot success means three design partners export their team's memory "
                     "by June.",
             actor=Actor.of(lead))


def _seed_content(session: Session, user: User) -> None:
    first = user.display_name.split()[0]
    session.add_all([
        ProfileFact(user_id=user.id, key="name", value=user.display_name),
        ProfileFact(user_id=user.id, key="timezone", value="Europe/Paris"),
        ProfileFact(user_id=user.id, key="role", value="product designer"),
        Blink(user_id=user.id, title="Standup", content=f"{first} runs standup at 9:30 daily."),
        Blink(user_id=user.id, title="Private", content="Gift ideas for the team offsite.",
              excluded_from_memory=True),
        Memory(owner_id=user.id, content=f"{first} prefers concise answers with examples.",
               source="chatgpt", metadata_={"topic": "preferences"}),
        Document(user_id=user.id, title="Onboarding notes", filename="onboarding.txt",
                 content="Week one: meet the team, set up the laptop, ship a small fix."),
    ])
    conversation = Conversation(user_id=user.id, title="Trip planning")
    session.add(conversation)
    session.flush()
    turns = [
        ("user", "I'm planning a trip to Lisbon in May. What should I pack?"),
        ("assistant", "Light layers, comfortable shoes for the hills, and a light jacket."),
        ("user", "My passport number is on a sticky note, please don't keep that."),
        ("assistant", "Understood. Keep it somewhere safe and don't share it in chat."),
        ("user", "Which neighbourhood is good for food?"),
        ("assistant", "Try Alfama for traditional food and Príncipe Real for cafés."),
    ]
    previous_user: Message | None = None
    for position, (role, content) in enumerate(turns):
        message = Message(
            conversation_id=conversation.id, user_id=user.id, role=role, position=position,
            content=content, not_remembered=(position == 2),
            reply_to_id=previous_user.id if role == "assistant" and previous_user else None,
        )
        session.add(message)
        session.flush()
        previous_user = message if role == "user" else None
