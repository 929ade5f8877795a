"""The support explorer: read-only, for support staff and admins.

Thin: parse the address, call ``dashboard.support.services``, render. Every page is a
GET that changes nothing, so there is no form to protect and nothing to commit."""

from __future__ import annotations

from typing import Any

from flask import abort, redirect, request
from flask_admin import BaseView, expose

from dashboard.extensions import db
from dashboard.staff import RoleGate
from dashboard.support.services import find_user_id, plan_report, user_trace

NO_SUCH_USER = "There is no such user."
NO_MATCH = "No user has that email or id."


class SupportView(RoleGate, BaseView):
    @expose("/")
    def index(self) -> Any:
        query = request.args.get("q", "").strip()
        if not query:
            return self.render("support/index.html", q="", message=None)
        user_id = find_user_id(db.session, query)
        if user_id is None:
            # The same page again, with the query kept so it can be corrected.
            return self.render("support/index.html", q=query, message=NO_MATCH), 404
        return redirect(self.get_url(".trace", user_id=user_id))

    @expose("/users/<int:user_id>")
    def trace(self, user_id: int) -> Any:
        trace = user_trace(db.session, user_id)
        if trace is None:
            abort(404, NO_SUCH_USER)
        return self.render("support/trace.html", trace=trace)

    @expose("/plans")
    def plans(self) -> Any:
        return self.render("support/plans.html", plans=plan_report(db.session))
