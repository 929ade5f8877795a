"""The support explorer: read-only, for support staff and admins.

Thin: parse the address, call ``dashboard.support.services``, render. Every page is a
GET that changes nothing, so there is no form to protect and nothing to commit."""

from __future__ import annotations

from typing import Any

from flask import abort, redirect, request
from flask_admin import BaseView, expose

from dashboard.extensions import db
from dashboard.memory import last_verification
from dashboard.staff import RoleGate
from dashboard.support.services import (
    MIN_PART,
    find_teams,
    find_users,
    plan_report,
    team_trace,
    user_trace,
)

NO_SUCH_USER = "There is no such user."
NO_SUCH_TEAM = "There is no such team."
NO_MATCH = ("No user has that email or id, or an email with that in it; no team has that "
            "name or slug, or such a member.")
TOO_SHORT = (f"Type at least {MIN_PART} characters of an email, a team name or slug, "
             "or an id.")


class SupportView(RoleGate, BaseView):
    @expose("/")
    def index(self) -> Any:
        query = request.args.get("q", "").strip()
        if not query:
            return self.render("support/index.html", q="", message=None,
                               truth=last_verification(db.session))
        matches, more = find_users(db.session, query)
        teams, more_teams = find_teams(db.session, query)
        if len(matches) + len(teams) == 1 and not (more or more_teams):
            if teams:
                return redirect(self.get_url(".team", team_id=teams[0].id))
            return redirect(self.get_url(".trace", user_id=matches[0].id))
        truth = last_verification(db.session)
        if not matches and not teams:
            # The same page again, with the query kept so it can be corrected.
            short = len(query) < MIN_PART and not query.isdigit()
            return self.render("support/index.html", q=query, truth=truth,
                               message=TOO_SHORT if short else NO_MATCH), 404
        return self.render("support/index.html", q=query, message=None, matches=matches,
                           more=more, teams=teams, more_teams=more_teams, truth=truth)

    @expose("/users/<int:user_id>")
    def trace(self, user_id: int) -> Any:
        trace = user_trace(db.session, user_id)
        if trace is None:
            abort(404, NO_SUCH_USER)
        if trace.kind == "team":  # a team's account: its trace is the team's
            return redirect(self.get_url(".team", team_id=user_id))
        return self.render("support/trace.html", trace=trace)

    @expose("/teams/<int:team_id>")
    def team(self, team_id: int) -> Any:
        team = team_trace(db.session, team_id)
        if team is None:
            abort(404, NO_SUCH_TEAM)
        return self.render("support/team.html", team=team, trace=team.account)

    @expose("/plans")
    def plans(self) -> Any:
        return self.render("support/plans.html", plans=plan_report(db.session))
