"""The team pages' forms. They carry values and the CSRF token; the services validate
(and refuse with the field a sentence is about)."""

from __future__ import annotations

from flask_wtf import FlaskForm
from wtforms import HiddenField, RadioField, SelectField, StringField
from wtforms.fields import SelectChoice

from dashboard.teams.models import APP_POLICIES, FORGET_POLICIES, LEAVER_POLICIES, WRITE_POLICIES
from dashboard.teams.services import MAX_NAME

ROLE_WORDS = {
    "owner": "everything, including making and removing owners",
    "admin": "manages members, invitations, controls and every memory",
    "member": "reads, saves and shares; changes and forgets their own",
    "reader": "reads and searches only",
}
POLICY_WORDS = {
    "write_policy": {"members": "Members, admins and owners",
                     "admins": "Admins and owners only"},
    "forget_policy": {"author_or_admins": "The member who saved it, or an admin or owner",
                      "admins": "Admins and owners only"},
    "app_policy": {"any": "Any app a member connects for the team",
                   "allow_list": "Only apps on the team's list",
                   "approve": "Each new app once an admin approves it"},
    "leaver_policy": {"keep": "Keep them, shown as saved by “a former member”",
                      "erase": "Erase them for good, each with a receipt"},
}


class CreateTeamForm(FlaskForm):
    name = StringField("Team name", render_kw={"maxlength": MAX_NAME, "autocomplete": "off"})
    slug = StringField("Short name for its address",
                       description="3 to 40 lower-case letters, digits and hyphens: the "
                                   "team's pages are at /teams/<short name>/.",
                       render_kw={"maxlength": 40, "autocomplete": "off",
                                  "autocapitalize": "none", "spellcheck": "false"})


class InviteForm(FlaskForm):
    email = StringField("Their email address",
                        render_kw={"type": "email", "maxlength": 254, "autocomplete": "off"})
    role = SelectField("Role", choices=[SelectChoice(r, f"{r.capitalize()}: {w}")
                                        for r, w in ROLE_WORDS.items()],
                       default="member", validate_choice=False)


def _radios(name: str, label: str, allowed: tuple[str, ...]) -> RadioField:
    return RadioField(label, choices=[SelectChoice(v, POLICY_WORDS[name][v]) for v in allowed],
                      validate_choice=False)


class SettingsForm(FlaskForm):
    write_policy = _radios("write_policy", "Who may save and share to the team (and change "
                           "what they saved)", WRITE_POLICIES)
    forget_policy = _radios("forget_policy", "Who may forget or redact a team memory",
                            FORGET_POLICIES)
    app_policy = _radios("app_policy", "Which connected apps may act for the team",
                         APP_POLICIES)
    max_key_days = StringField("Longest lifetime of an API key acting for the team (days)",
                               description="Leave empty for no limit. A key that lives "
                                           "longer (or never expires) cannot act for the "
                                           "team.",
                               render_kw={"inputmode": "numeric", "maxlength": 4,
                                          "autocomplete": "off"})
    leaver_policy = _radios("leaver_policy", "What becomes of a leaver's memories",
                            LEAVER_POLICIES)


class MemberForm(FlaskForm):
    """A POST about one member (a removal): the CSRF token and whom."""

    user_id = HiddenField()
