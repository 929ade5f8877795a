"""Demo data for ``flask seed-demo``: three plans, users on each, staff, a little content."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session
from werkzeug.security import generate_password_hash

from dashboard.auth.models import User
from dashboard.auth.services import create_user, get_user_by_email
from dashboard.blinks.models import Blink
from dashboard.documents.models import Document
from dashboard.memories.models import Memory
from dashboard.orbitpilot.models import Conversation, Message, ProfileFact
from dashboard.plans.models import Plan, SourceAssignment

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
    return seeded


def describe_seeded(seeded: list[SeededUser], password: str) -> list[str]:
    """The lines the run command and ``flask seed-demo`` print for the person at the
    keyboard (a demo-only password)."""
    return [f"Demo accounts (password for all: {password}):"] + [
        f"  {user.role:<8} {user.plan:<5} {user.email}  [{'created' if user.created else 'exists'}]"
        for user in seeded
    ]


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
