"""``/teams/``: a person's teams and the pages of each — its home (members, invitations),
joining by a link, its controls, who can see its memory, its Memory Status and its audit
log. The team memories page is the memories package's (``memories.team_pages``).

Someone who is not a member gets the same 404 as for a team that does not exist; a member
whose role may not do something gets a 403 with a sentence. Only a POST changes anything
(behind CSRF); a double click answers as the first click did. docs/architecture/teams.md."""

from __future__ import annotations

import csv
import io
import logging
from datetime import UTC, datetime
from typing import Any, NoReturn

from flask import (
    Blueprint,
    Response,
    abort,
    current_app,
    flash,
    redirect,
    render_template,
    request,
    url_for,
)
from flask_login import current_user, login_required
from flask_wtf import FlaskForm
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from dashboard.access import Action, TeamSeat, may
from dashboard.audit.actions import ACTIONS
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.connectors.models import OAuthClient
from dashboard.errors import refusal_status
from dashboard.extensions import db, login_manager
from dashboard.forms import NO_TOKEN
from dashboard.holds import active_hold
from dashboard.ids import INT8_MAX, parse_id, parse_int
from dashboard.memory import embedder_model_name, memory_status, settings_from
from dashboard.plans.services import retention_of
from dashboard.plans.web import resolution_of
from dashboard.refusals import FieldError, Refusal
from dashboard.retention.services import retention_notice
from dashboard.saved_memories.models import Memory
from dashboard.sources import registered_sources
from dashboard.teams import reads, services
from dashboard.teams.forms import (
    POLICY_WORDS,
    ROLE_WORDS,
    CreateTeamForm,
    InviteForm,
    MemberForm,
    SettingsForm,
)
from dashboard.teams.models import ROLES, Team, TeamMember
from dashboard.teams.services import (
    InvitationUnusable,
    LastOwner,
    RoleTooLow,
    TeamError,
    TeamNotFound,
)

log = logging.getLogger(__name__)

bp = Blueprint("teams", __name__, url_prefix="/teams")

# The endpoints whose POSTs stamp a member's last activity in the team (after they
# answered, in a transaction of its own: see ``stamp_activity``).
TEAM_ENDPOINTS = ("teams.", "team_memories.")
MANAGERS_ONLY = "Only the team's owners and admins can {what}. Your role in {team} is {role}."
# What each role may do, as the "Who can see" page lists it (access.may decides).
SEEN_ACTIONS = (
    (Action.READ, "read and search"),
    (Action.WRITE, "save"),
    (Action.SHARE, "share their own"),
)
OWN_OR_ANY = (
    (Action.EDIT, "change"),
    (Action.FORGET, "forget or restore"),
    (Action.REDACT, "redact"),
)
MANAGE_WORDS = "invite, remove, change roles and controls, read the audit log"


def _refuse(exc: Refusal) -> NoReturn:
    abort(refusal_status(exc), exc.sentence)


def _team(slug: str, action: Action = Action.READ, what: str | None = None
          ) -> tuple[Team, TeamMember]:
    """The team and the signed-in person's membership; 404 alike for a team that does
    not exist and one they are not in, 403 with a sentence for a role that may not."""
    try:
        return services.team_for(db.session, current_user.id, slug, action=action)
    except TeamNotFound as exc:
        abort(404, exc.sentence)
    except RoleTooLow as exc:
        if what is None:
            abort(403, exc.sentence)
        team = services.get_team(db.session, slug)
        member = services.membership(db.session, team.id, current_user.id) if team else None
        abort(403, MANAGERS_ONLY.format(what=what, team=team.name if team else slug,
                                        role=member.role if member else "none"))


def _seat(team: Team, member: TeamMember) -> TeamSeat:
    return services.seat_of(team, member)


def _checked_token() -> None:
    if not FlaskForm().validate_on_submit():
        abort(400, NO_TOKEN)


def _field_error(form: FlaskForm, exc: FieldError) -> bool:
    field = getattr(form, exc.field or "", None)
    if field is None:
        return False
    field.errors = [*field.errors, exc.sentence]
    return True


@bp.app_template_filter("ago")
def ago(moment: datetime | None) -> str:
    """A time as people say it: "today", "yesterday", "3 days ago", "in 5 days"."""
    if moment is None:
        return "never"
    now = datetime.now(UTC)
    days = (now.date() - moment.astimezone(UTC).date()).days
    if days == 0:
        return "today"
    if days == 1:
        return "yesterday"
    if days == -1:
        return "tomorrow"
    if days < 0:
        return f"in {-days} days"
    if days < 60:
        return f"{days} days ago"
    return f"{days // 30} months ago" if days < 730 else f"{days // 365} years ago"


# The team export's page (the exports package's, for owners and admins), when the app has
# one: the team nav links it.
TEAM_EXPORT = "exports.team"
TEAM_EVIDENCE = "evidence.team"


@bp.app_context_processor
def team_words() -> dict[str, Any]:
    export = TEAM_EXPORT if TEAM_EXPORT in current_app.view_functions else None
    evidence = TEAM_EVIDENCE if TEAM_EVIDENCE in current_app.view_functions else None
    return {"ROLE_WORDS": ROLE_WORDS, "TEAM_ROLES": ROLES, "TEAM_EXPORT_ENDPOINT": export,
            "TEAM_EVIDENCE_ENDPOINT": evidence}


@bp.after_app_request
def stamp_activity(response: Response) -> Response:
    """A member's POST on a team page that worked is their last activity there. Stamped
    after the answer, in a transaction of its own, so it never holds their membership
    row while the action locks the team (a removal would wait on it, and it on them).
    GET and HEAD change nothing, so reading is not activity."""
    if request.method != "POST" or response.status_code >= 400 \
            or not (request.endpoint or "").startswith(TEAM_ENDPOINTS) \
            or not current_user.is_authenticated:
        return response
    slug = (request.view_args or {}).get("slug")
    try:
        team = services.get_team(db.session, slug)
        if team is not None:
            services.touch(db.session, team.id, current_user.id)
            db.session.commit()
    except SQLAlchemyError as exc:  # the answer stands; the stamp waits for the next one
        db.session.rollback()
        log.warning("last activity not stamped: %s", type(exc).__name__)
    return response


# -- my teams ---------------------------------------------------------------------------------

def _member_counts(team_ids: list[int]) -> dict[int, int]:
    if not team_ids:
        return {}
    return dict(db.session.execute(
        select(TeamMember.team_id, func.count()).where(TeamMember.team_id.in_(team_ids))
        .group_by(TeamMember.team_id)).all())


def _index_page(form: CreateTeamForm, status: int = 200) -> Any:
    mine = services.teams_of(db.session, current_user.id)
    counts = _member_counts([team.id for team, _ in mine])
    return render_template("teams/index.html", teams=mine, counts=counts, form=form), status


def _made_by_this_click(form: CreateTeamForm) -> Team | None:
    """A slug refused as taken, by the team this person's own click just made (a double
    click, or two at once: the second waited for the first's commit)."""
    try:
        slug, name = services.check_slug(form.slug.data), services.check_name(form.name.data)
    except TeamError:
        return None
    team = services.get_team(db.session, slug)
    if team is None or team.created_by_id != current_user.id or team.name != name:
        return None
    member = services.membership(db.session, team.id, current_user.id)
    return team if member is not None and member.role == "owner" else None


@bp.route("/", methods=["GET", "POST"])
@login_required
def index():
    """The person's teams (name, their role, how many members) and "Create a team"."""
    form = CreateTeamForm()
    if request.method != "POST":  # GET and HEAD show; only a POST changes
        return _index_page(form)
    if not form.validate_on_submit():
        return _index_page(form, 400)
    try:
        team = services.create_team(db.session, creator=current_user, name=form.name.data,
                                    slug=form.slug.data, actor=Actor.of(current_user))
    except TeamError as exc:
        again = _made_by_this_click(form) if exc.field == "slug" else None
        if again is not None:
            return redirect(url_for("teams.home", slug=again.slug), 303)
        _field_error(form, exc)
        return _index_page(form, 400)
    slug, name = team.slug, team.name
    db.session.commit()
    flash(f"Team {name} created. You are its owner: invite its members below.", "success")
    return redirect(url_for("teams.home", slug=slug), 303)


# -- the team's home --------------------------------------------------------------------------

def _home_page(team: Team, me: TeamMember, invite_form: InviteForm | None = None,
               status: int = 200) -> Any:
    seat = _seat(team, me)
    creds = reads.credentials(db.session, team)
    rows = reads.member_rows(db.session, team, creds)
    managing = may(seat, Action.INVITE)
    invitations = services.pending_invitations(db.session, team.id) if managing else []
    return render_template(
        "teams/home.html", team=team, me=me, seat=seat, rows=rows, managing=managing,
        owners=reads.owners_count(rows), invitations=invitations,
        invite_form=invite_form or InviteForm(), role_choices=_role_choices(me),
        member_form=MemberForm(), now=datetime.now(UTC)), status


def _role_choices(me: TeamMember) -> list[str]:
    """The roles ``me`` may give: an admin makes no owners."""
    return [role for role in ROLES if me.role == "owner" or role != "owner"]


@bp.route("/<slug>/")
@login_required
def home(slug: str):
    """Members (and what they use with the team), invitations, role changes, leaving."""
    team, me = _team(slug)
    return _home_page(team, me)


@bp.route("/<slug>/members/role", methods=["POST"])
@login_required
def change_role(slug: str):
    """Form fields ``user_id`` and ``role``. Only an owner touches owners; the last
    owner keeps the role (the page says why beforehand)."""
    team, me = _team(slug, Action.CHANGE_ROLE, "change roles")
    _checked_token()
    user_id = parse_id(request.form.get("user_id"))
    if user_id is None:
        abort(404, "There is no such member.")
    try:
        member = services.change_role(db.session, team, me, user_id, request.form.get("role"),
                                      actor=Actor.of(current_user))
    except Refusal as exc:
        _refuse(exc)
    person = db.session.get(User, member.user_id)
    words = f"{person.email} is now {'an' if member.role in ('owner', 'admin') else 'a'} " \
            f"{member.role}."
    db.session.commit()
    flash(words, "success")
    return redirect(url_for("teams.home", slug=slug, _anchor="members"), 303)


def _erase_count(team_id: int, user_id: int) -> int:
    return db.session.scalar(select(func.count()).select_from(Memory).where(
        Memory.owner_id == team_id, Memory.author_id == user_id)) or 0


def _removal_page(team: Team, me: TeamMember, member: TeamMember, person: User, *,
                  leaving: bool, owners: int, status: int = 200, error: str | None = None
                  ) -> Any:
    problem = None
    if not leaving and member.role == "owner" and me.role != "owner":
        problem = "Only an owner can remove an owner."
    elif member.role == "owner" and owners == 1:
        problem = ("You are the team's last owner, so you cannot leave: make someone else "
                   "an owner first." if leaving else
                   "This is the team's last owner: they cannot be removed. Make someone "
                   "else an owner first.")
    return render_template(
        "teams/remove.html", team=team, me=me, seat=_seat(team, me), member=member,
        person=person, leaving=leaving, problem=problem or error,
        erase=team.leaver_policy == "erase",
        erasing=_erase_count(team.id, member.user_id) if team.leaver_policy == "erase" else 0,
        held=active_hold(db.session, team.id) is not None, form=MemberForm()), status


def _owners(team_id: int) -> int:
    return sum(1 for m in services.members_of(db.session, team_id) if m.role == "owner")


def _removed_words(team: Team, removal: services.Removal, who: str, *, leaving: bool) -> str:
    words = f"You left {team.name}." if leaving else f"{who} was removed from {team.name}."
    if removal.erase:
        n = len(removal.receipts)
        pending = sum(1 for r in removal.receipts if r.pending)
        ids = ", ".join(f"#{r.marker_id}" for r in removal.receipts[:10])
        words += (f" Under the team's leaver policy the {n} memor{'y' if n == 1 else 'ies'} "
                  f"{'you' if leaving else 'they'} saved to it {'was' if n == 1 else 'were'} "
                  f"erased for good, each with a receipt{f' ({ids})' if n else ''}.")
        if pending:
            words += (f" The team is under a legal hold: {pending} of these erasures wait "
                      "for it to end (the memories are no longer recalled meanwhile).")
    return words


@bp.route("/<slug>/members/remove", methods=["GET", "POST"])
@login_required
def remove(slug: str):
    """GET ``?user_id=`` says what removing them does (and erases, under the leaver
    policy "erase") and asks; POST removes. A second click finds them gone and answers
    as the first did."""
    team, me = _team(slug, Action.REMOVE, "remove members")
    raw = request.form.get("user_id") if request.method == "POST" else None
    user_id = parse_id(raw if raw is not None else request.args.get("user_id"))
    member = services.membership(db.session, team.id, user_id) if user_id else None
    if request.method != "POST":
        if member is None:
            abort(404, "There is no such member.")
        return _removal_page(team, me, member, db.session.get(User, member.user_id),
                             leaving=member.user_id == me.user_id,
                             owners=_owners(team.id))
    _checked_token()
    if member is None:  # removed already (a double click): as the first answered
        return redirect(url_for("teams.home", slug=slug, _anchor="members"), 303)
    person = db.session.get(User, member.user_id)
    who, leaving = person.email, member.user_id == me.user_id
    try:
        removal = services.remove_member(db.session, team, me, member.user_id,
                                         actor=Actor.of(current_user))
    except (LastOwner, RoleTooLow) as exc:
        db.session.rollback()
        return _removal_page(team, me, member, person, leaving=leaving,
                             owners=_owners(team.id), status=refusal_status(exc),
                             error=exc.sentence)
    except Refusal as exc:
        db.session.rollback()
        _refuse(exc)
    words = _removed_words(team, removal, who, leaving=leaving)
    db.session.commit()
    flash(words, "success")
    if leaving:
        return redirect(url_for("teams.index"), 303)
    return redirect(url_for("teams.home", slug=slug, _anchor="members"), 303)


@bp.route("/<slug>/leave", methods=["GET", "POST"])
@login_required
def leave(slug: str):
    """GET says what leaving does and asks; POST leaves. Someone not (or no longer) in
    the team is sent to their teams: a second click answers as the first did, and a
    stranger learns nothing either way."""
    if request.method == "POST":
        _checked_token()
        team = services.get_team(db.session, slug)
        me = services.membership(db.session, team.id, current_user.id) if team else None
        if team is None or me is None:
            return redirect(url_for("teams.index"), 303)
        try:
            removal = services.remove_member(db.session, team, me, me.user_id,
                                             actor=Actor.of(current_user))
        except LastOwner as exc:
            db.session.rollback()
            return _removal_page(team, me, me, current_user, leaving=True,
                                 owners=_owners(team.id), status=refusal_status(exc),
                                 error=exc.sentence)
        words = _removed_words(team, removal, current_user.email, leaving=True)
        db.session.commit()
        flash(words, "success")
        return redirect(url_for("teams.index"), 303)
    team, me = _team(slug)
    return _removal_page(team, me, me, current_user, leaving=True, owners=_owners(team.id))


# -- invitations ------------------------------------------------------------------------------

@bp.route("/<slug>/invitations", methods=["POST"])
@login_required
def invite(slug: str):
    """Owners and admins: a single-use link for an email and a role, shown once to copy
    (there is no mail server). Inviting the same address again replaces its link."""
    team, me = _team(slug, Action.INVITE, "invite")
    form = InviteForm()
    if not form.validate_on_submit():
        return _home_page(team, me, form, 400)
    try:
        invited = services.invite(db.session, team, me, email=form.email.data,
                                  role=form.role.data, actor=Actor.of(current_user))
    except TeamError as exc:
        db.session.rollback()
        _field_error(form, exc)
        return _home_page(team, me, form, 400)
    except Refusal as exc:
        db.session.rollback()
        _refuse(exc)
    invitation = invited.invitation
    shown = {"email": invitation.email, "role": invitation.role,
             "expires_at": invitation.expires_at}
    db.session.commit()
    link = url_for("teams.join", token=invited.token, _external=True)
    return render_template("teams/invited.html", team=team, me=me, seat=_seat(team, me),
                           link=link, **shown)


@bp.route("/<slug>/invitations/revoke", methods=["POST"])
@login_required
def revoke(slug: str):
    """Form field ``invitation_id``: the link stops working (again: nothing more)."""
    team, me = _team(slug, Action.INVITE, "withdraw invitations")
    _checked_token()
    try:
        invitation = services.revoke_invitation(db.session, team, me,
                                                request.form.get("invitation_id"),
                                                actor=Actor.of(current_user))
    except Refusal as exc:
        _refuse(exc)
    email = invitation.email
    db.session.commit()
    flash(f"The invitation for {email} was withdrawn: its link no longer works.", "success")
    return redirect(url_for("teams.home", slug=slug, _anchor="invitations"), 303)


def _join_status(invitation: Any, user: Any) -> int:
    """An unknown link and one for someone else: 404 alike; a used, withdrawn or
    expired one: 410."""
    if invitation is None or (user is not None and user.email != invitation.email):
        return 404
    return 410


@bp.route("/join/<token>", methods=["GET", "POST"])
def join(token: str):
    """GET: what the invitation is (team, role) and, signed in as the invited address, a
    button to accept; POST accepts. A second click finds the membership the first made."""
    user = current_user if current_user.is_authenticated else None
    if request.method == "POST":
        if user is None:
            return login_manager.unauthorized()
        _checked_token()
        try:
            member = services.accept_invitation(db.session, token, user,
                                                actor=Actor.of(user))
        except InvitationUnusable as exc:
            db.session.rollback()
            invitation = services.find_invitation(db.session, token)
            return render_template("teams/join.html", problem=exc.sentence, token=token,
                                   invitation=None), _join_status(invitation, user)
        team = db.session.get(Team, member.team_id)
        slug, name, role = team.slug, team.name, member.role
        db.session.commit()
        flash(f"Welcome to {name}: you are {'an' if role in ('owner', 'admin') else 'a'} "
              f"{role}.", "success")
        return redirect(url_for("teams.home", slug=slug), 303)
    invitation = services.find_invitation(db.session, token)
    if user is not None and invitation is not None and invitation.accepted_by_id == user.id \
            and services.membership(db.session, invitation.team_id, user.id) is not None:
        return redirect(url_for("teams.home", slug=invitation.team.slug), 303)
    problem = services.invitation_problem(invitation, user)
    if problem is not None:
        return render_template("teams/join.html", problem=problem, token=token,
                               invitation=None), _join_status(invitation, user)
    return render_template("teams/join.html", problem=None, token=token,
                           invitation=invitation, team=invitation.team, form=FlaskForm())


# -- the team's controls ----------------------------------------------------------------------

def _settings_page(team: Team, me: TeamMember, form: SettingsForm, status: int = 200) -> Any:
    account = db.session.get(User, team.id)
    resolution = resolution_of(account)
    plan = resolution.plan
    windows = retention_of(plan.retention) if plan else {}
    labels = {s.key: s.label for s in registered_sources()}
    return render_template(
        "teams/settings.html", team=team, me=me, seat=_seat(team, me), form=form,
        words=POLICY_WORDS, plan=plan, resolution=resolution,
        windows=[(labels.get(key, key), days) for key, days in windows.items()],
        hold=active_hold(db.session, team.id),
        allowed=reads.allowed_apps(db.session, team.id),
        candidates=reads.app_candidates(db.session, team.id), app_form=FlaskForm()), status


@bp.route("/<slug>/settings", methods=["GET", "POST"])
@login_required
def settings(slug: str):
    """The account controls (owners and admins): who writes, who forgets, which apps act
    for the team, the longest key lifetime, the leaver policy; its plan, retention and any
    legal hold as they are. Each change is audited with its before and after."""
    team, me = _team(slug, Action.CHANGE_POLICY, "change the team's controls")
    current = services.Policies.of(team)
    if request.method != "POST":  # GET and HEAD show; only a POST changes
        form = SettingsForm(data={**current.__dict__, "max_key_days":
                                  "" if current.max_key_days is None
                                  else str(current.max_key_days)})
        return _settings_page(team, me, form)
    form = SettingsForm()
    if not form.validate_on_submit():
        return _settings_page(team, me, form, 400)
    try:
        after = services.set_policies(
            db.session, team, me, write_policy=form.write_policy.data,
            forget_policy=form.forget_policy.data, app_policy=form.app_policy.data,
            max_key_days=(form.max_key_days.data or "").strip(),
            leaver_policy=form.leaver_policy.data, actor=Actor.of(current_user))
    except TeamError as exc:
        db.session.rollback()
        _field_error(form, exc)
        return _settings_page(team, me, form, 400)
    db.session.commit()
    flash("The team's controls were saved." if after != current else
          "Nothing changed: the controls were already so.", "success")
    return redirect(url_for("teams.settings", slug=slug), 303)


@bp.route("/<slug>/settings/apps", methods=["POST"])
@login_required
def apps(slug: str):
    """Form fields ``client_pk`` and ``op`` (``approve`` or ``remove``): an app on the
    team's list may act for it under the allow-list and approval policies."""
    team, me = _team(slug, Action.CHANGE_POLICY, "allow or remove apps")
    _checked_token()
    pk = parse_int(request.form.get("client_pk"), 1, INT8_MAX)
    client = db.session.get(OAuthClient, pk) if pk is not None else None
    op = request.form.get("op")
    if op not in ("approve", "remove"):
        abort(400, "Choose to approve or to remove the app.")
    if client is None:
        abort(404, "There is no such app.")
    client_id = client.client_id
    if op == "approve":
        services.approve_app(db.session, team, me, client.id, actor=Actor.of(current_user))
        words = f"The app {client_id} may act for the team."
    else:
        services.disallow_app(db.session, team, me, client.id, actor=Actor.of(current_user))
        words = f"The app {client_id} is off the team's list."
    db.session.commit()
    flash(words, "success")
    return redirect(url_for("teams.settings", slug=slug, _anchor="apps"), 303)


# -- who can see it, its Memory Status, its audit log -----------------------------------------

@bp.route("/<slug>/access")
@login_required
def access(slug: str):
    """Who can see this team's memory: each member and what their role lets them do, and
    every API key and connected app that may act for the team now (and those named that
    may not, with why)."""
    team, me = _team(slug)
    creds = reads.credentials(db.session, team)
    rows = reads.member_rows(db.session, team, creds)
    abilities = {}
    for row in rows:
        seat = _seat(team, row.member)
        can = [words for action, words in SEEN_ACTIONS if may(seat, action)]
        for action, words in OWN_OR_ANY:
            if may(seat, action):
                can.append(f"{words} any")
            elif may(seat, action, author=True):
                can.append(f"{words} their own")
        if may(seat, Action.HARD_DELETE):
            can.append("erase for good")
        if may(seat, Action.INVITE):
            can.append(MANAGE_WORDS)
        abilities[row.user.id] = can
    return render_template("teams/access.html", team=team, me=me, seat=_seat(team, me),
                           rows=rows, abilities=abilities, creds=creds,
                           now=datetime.now(UTC))


@bp.route("/<slug>/status")
@login_required
def status(slug: str):
    """The team's Memory Status: its account's, on the Memory Status page's partials —
    every source with its sentence, the chunks stored, the last build, the next one."""
    team, me = _team(slug)
    account = db.session.get(User, team.id)
    resolution = resolution_of(account)
    engine = settings_from(current_app.config)
    page = memory_status(db.session, account, resolution=resolution,
                         embedder_name=embedder_model_name(engine.embedder))
    notice = retention_notice(db.session, team.id, resolution.plan.restore_window_days) \
        if resolution.plan else None
    return render_template("teams/status.html", team=team, me=me, seat=_seat(team, me),
                           page=page, notice=notice, team_status=True)


def _audit_filters() -> reads.AuditFilters:
    try:
        return reads.AuditFilters.parse(request.args, ACTIONS)
    except reads.AuditFilterError as exc:
        abort(400, str(exc))


def _seq(name: str) -> int | None:
    raw = request.args.get(name)
    if raw is None:
        return None
    value = parse_int(raw, 0, INT8_MAX)
    if value is None:
        abort(400, f"The “{name}” value in the address is not valid.")
    return value


@bp.route("/<slug>/audit")
@login_required
def audit(slug: str):
    """The team's audit events (owners and admins): its own and its memories', newest
    first, filtered by action, actor and date, paged by position. Ids, codes and counts
    only: no column that could hold words anyone typed is read."""
    team, me = _team(slug, Action.AUDIT, "read the team's audit log")
    filters = _audit_filters()
    before, after = _seq("before"), _seq("after")
    if before is not None and after is not None:
        abort(400, "A page is either before or after a position, not both.")
    page = reads.team_events(db.session, team.id, filters, before=before, after=after,
                             limit=reads.AUDIT_PAGE)
    members = db.session.execute(
        select(User.id, User.email).join(TeamMember, TeamMember.user_id == User.id)
        .where(TeamMember.team_id == team.id).order_by(User.email)).all()
    return render_template("teams/audit.html", team=team, me=me, seat=_seat(team, me),
                           page=page, filters=filters, actions=ACTIONS, members=members,
                           kinds=reads.ACTOR_KINDS, moved=before is not None
                           or after is not None)


CSV_COLUMNS = ("seq", "occurred_at", "action", "actor_type", "actor_id", "target_type",
               "target_id", "mode", "details", "hash")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: object) -> object:
    """A text cell a spreadsheet would run as a formula gets a leading apostrophe."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


@bp.route("/<slug>/audit.csv")
@login_required
def audit_csv(slug: str):
    """The same events as a CSV file (the newest 10,000 the filters keep)."""
    team, _ = _team(slug, Action.AUDIT, "read the team's audit log")
    filters = _audit_filters()
    rows = reads.team_events_export(db.session, team.id, filters)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        writer.writerow([_cell(v) for v in (
            row.seq, row.occurred_at.isoformat(), row.action, row.actor_type,
            row.actor_id or "", row.target_type or "", row.target_id or "", row.mode or "",
            "; ".join(f"{k}={v}" for k, v in row.facts), row.hash)])
    name = f"team-{team.slug}-audit_{datetime.now(UTC):%Y-%m-%d_%H-%M-%S}.csv"
    return Response(out.getvalue(), mimetype="text/csv",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})
