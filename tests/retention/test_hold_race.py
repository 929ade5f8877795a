"""Two legal holds placed on one user at once by two staff members (two requests, two
real transactions, see tests/races.py): one hold; the second is told, as a form error,
that the user is already under a legal hold — never a 500."""

from __future__ import annotations

from sqlalchemy import func, select

from dashboard.extensions import db
from dashboard.holds import LegalHold
from tests.races import (
    JOIN,
    Request,
    audit_chain_held,
    signed_in,
    token,
    waiting_on_a_transaction,
    waiting_on_the_chain,
)
from tests.saved_memories.helpers import wait_until

PAGE = "/admin/retention/"


def test_two_holds_placed_at_once_make_one_and_the_second_is_a_form_error(
        app, committed, queue):
    person = committed.user()
    admins = [committed.user(role="admin"), committed.user(role="admin")]
    committed.session.commit()
    first, second = (signed_in(app, admin.email) for admin in admins)
    forms = [{"csrf_token": token(client, PAGE), "email": person.email,
              "reason": "matter 41", "ends_at": ""} for client in (first, second)]
    a = Request(lambda: first.post(PAGE + "holds", data=forms[0]))
    b = Request(lambda: second.post(PAGE + "holds", data=forms[1]))
    with audit_chain_held(db.engine):
        a.start()
        assert wait_until(lambda: waiting_on_the_chain(db.engine) == 1, a)
        b.start()
        assert wait_until(lambda: waiting_on_a_transaction(db.engine) == 1, b)
    a.join(JOIN)
    b.join(JOIN)
    assert (a.error, b.error) == (None, None)
    assert a.response.status_code == 303
    assert b.response.status_code == 400
    assert "This user is already under a legal hold." in b.response.get_data(as_text=True)
    committed.session.expire_all()
    assert committed.session.scalar(select(func.count()).select_from(LegalHold).where(
        LegalHold.user_id == person.id)) == 1
