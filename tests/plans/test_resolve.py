"""resolve_build_sources: every state and edge of the rule."""

import pytest

from dashboard.plans.sentences import GUEST_INVITATION, state_sentence
from dashboard.plans.services import (
    SourceState,
    UserPlan,
    get_user_plan,
    resolve_build_sources,
    resolve_sources,
)
from dashboard.sources import BLINKS, PROFILE, SAVED, registered_sources, source_keys
from dashboard.sources import CHAT_HISTORY as CHAT
from dashboard.sources import DOCUMENTS as DOCS
from tests.factories import default_plan, make_plan, make_user, plans_of


def states(resolution):
    return {s.key: s.state for s in resolution.sources}


def test_registry_order_is_the_rank(app):  # the app installs the sources
    assert [s.key for s in registered_sources()] == [
        "orbitpilot.profile", "blink.blinks", "xmemo.saved", "orbitpilot.chat_history",
        "docs.documents",
    ]
    assert [s.default_visible for s in registered_sources()] == [True, True, True, True, False]
    assert source_keys() == (PROFILE, BLINKS, SAVED, CHAT, DOCS)


def test_untouched_plan_evicts_chat_history_su101_q1(db_session):
    user = make_user(db_session)  # no plan: the default (free) plan nobody edited
    resolution = resolve_build_sources(user, plans_of(db_session))
    assert states(resolution) == {
        PROFILE: SourceState.INCLUDED,
        BLINKS: SourceState.INCLUDED,
        SAVED: SourceState.INCLUDED,
        CHAT: SourceState.EVICTED_BY_CAP,
        DOCS: SourceState.NOT_ASSIGNED_BY_DEFAULT,
    }
    chat = resolution.get(CHAT)
    assert chat.cap == 3
    assert chat.filled_by == (PROFILE, BLINKS, SAVED)
    assert chat.decided_by == "default"
    assert chat.rank == 4
    assert state_sentence(chat, resolution) == (
        "Not remembered on the Free plan: your plan includes 3 sources, and your profile, "
        "your Blinks and saved memories come first."
    )


def test_cap_four_includes_chat_history(db_session):
    user = make_user(db_session, plan=make_plan(db_session, cap=4))
    resolution = resolve_build_sources(user, plans_of(db_session))
    assert resolution.get(CHAT).state is SourceState.INCLUDED
    assert resolution.included_keys == (PROFILE, BLINKS, SAVED, CHAT)
    assert resolution.get(DOCS).state is SourceState.NOT_ASSIGNED_BY_DEFAULT


def test_blinks_switched_off_includes_chat_history(db_session):
    plan = make_plan(db_session, cap=3, assignments={BLINKS: False})
    resolution = resolve_build_sources(make_user(db_session, plan=plan), plans_of(db_session))
    assert resolution.get(BLINKS).state is SourceState.NOT_ASSIGNED_BY_ADMIN
    assert resolution.get(BLINKS).decided_by == "plan_row"
    assert resolution.get(CHAT).state is SourceState.INCLUDED
    assert resolution.included_keys == (PROFILE, SAVED, CHAT)


def test_cap_zero_evicts_every_assigned_source(db_session):
    user = make_user(db_session, plan=make_plan(db_session, cap=0))
    resolution = resolve_build_sources(user, plans_of(db_session))
    assert states(resolution) == {
        PROFILE: SourceState.EVICTED_BY_CAP,
        BLINKS: SourceState.EVICTED_BY_CAP,
        SAVED: SourceState.EVICTED_BY_CAP,
        CHAT: SourceState.EVICTED_BY_CAP,
        DOCS: SourceState.NOT_ASSIGNED_BY_DEFAULT,
    }
    assert resolution.get(PROFILE).filled_by == ()
    assert resolution.included_keys == ()
    sentence = state_sentence(resolution.get(PROFILE), resolution)
    assert sentence.endswith("your plan includes no sources.")


def test_cap_above_registry_size_includes_every_assigned_source(db_session):
    plan = make_plan(db_session, cap=99, assignments={DOCS: True})
    resolution = resolve_build_sources(make_user(db_session, plan=plan), plans_of(db_session))
    assert resolution.included_keys == source_keys()
    assert all(s.cap == 99 for s in resolution.sources)


def test_admin_row_off_for_default_visible_source(db_session):
    plan = make_plan(db_session, cap=5, assignments={SAVED: False})
    resolution = resolve_build_sources(make_user(db_session, plan=plan), plans_of(db_session))
    saved = resolution.get(SAVED)
    assert saved.state is SourceState.NOT_ASSIGNED_BY_ADMIN
    assert saved.decided_by == "plan_row"
    assert not saved.assigned
    assert "an administrator switched saved memories off" in state_sentence(saved, resolution)


def test_admin_row_on_for_hidden_by_default_source(db_session):
    plan = make_plan(db_session, cap=5, assignments={DOCS: True})
    resolution = resolve_build_sources(make_user(db_session, plan=plan), plans_of(db_session))
    docs = resolution.get(DOCS)
    assert docs.state is SourceState.INCLUDED
    assert docs.decided_by == "plan_row"


def test_row_on_for_hidden_source_competes_for_the_cap_by_rank(db_session):
    # Documents rank last: switched on under cap 3 it is evicted, not included.
    plan = make_plan(db_session, cap=3, assignments={DOCS: True})
    resolution = resolve_build_sources(make_user(db_session, plan=plan), plans_of(db_session))
    docs = resolution.get(DOCS)
    assert docs.state is SourceState.EVICTED_BY_CAP
    assert docs.filled_by == (PROFILE, BLINKS, SAVED)


def test_explicit_row_on_same_as_default_is_decided_by_plan_row(db_session):
    plan = make_plan(db_session, cap=3, assignments={CHAT: True})
    chat = resolve_build_sources(make_user(db_session, plan=plan), plans_of(db_session)).get(CHAT)
    # An "on" row does not lift the cap: rank still decides.
    assert chat.state is SourceState.EVICTED_BY_CAP
    assert chat.decided_by == "plan_row"


def test_user_with_no_plan_is_on_the_default_plan(db_session):
    free = default_plan(db_session)
    free.included_sources = 4
    db_session.flush()
    user = make_user(db_session, plan=None)
    assert user.plan_id is None
    plan = get_user_plan(user, plans_of(db_session))
    assert (plan.id, plan.name, plan.included_sources) == (free.id, "Free", 4)
    assert resolve_build_sources(user, plans_of(db_session)).get(CHAT).state is SourceState.INCLUDED


def test_guest_remembers_nothing(app, db_session):
    from flask_login import AnonymousUserMixin

    with app.test_request_context("/"):
        resolution = resolve_build_sources(AnonymousUserMixin(), plans_of(db_session))
    assert resolution.guest
    assert {s.state for s in resolution.sources} == {SourceState.GUEST}
    assert resolution.included_keys == ()
    assert state_sentence(resolution.get(CHAT), resolution) == GUEST_INVITATION
    assert get_user_plan(AnonymousUserMixin(), plans_of(db_session)) is None


def test_resolution_snapshot_has_states_not_content():
    resolution = resolve_sources(UserPlan(7, "Team", "team", 3, False, {BLINKS: False}))
    snapshot = resolution.to_dict()
    assert snapshot["plan_id"] == 7 and snapshot["cap"] == 3
    assert [s["state"] for s in snapshot["sources"]] == [
        "included", "not_assigned_by_admin", "included", "included", "not_assigned_by_default"
    ]


@pytest.mark.parametrize("cap, chat_state", [(3, "evicted_by_cap"), (4, "included")])
def test_pure_rule_matches_database_backed(db_session, cap, chat_state):
    user = make_user(db_session, plan=make_plan(db_session, cap=cap))
    assert resolve_build_sources(user, plans_of(db_session)).get(CHAT).state.value == chat_state
    assert resolve_sources(UserPlan(None, "x", "x", cap, False)).get(CHAT).state.value == chat_state
