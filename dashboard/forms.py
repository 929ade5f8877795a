"""What the user's own pages (Blinks, profile facts, documents) do the same way: find the
signed-in user's row an id names (else 404), save a form — the service validates and
refuses with the field it is about; the view commits, says so and goes back to the list,
or shows the form again with the error — and delete a row behind a confirm page, which a
legal hold may refuse."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from flask import abort, flash, redirect, request, url_for
from flask_wtf import FlaskForm
from sqlalchemy.orm import Session
from werkzeug.exceptions import NotFound

from dashboard.extensions import db
from dashboard.holds import HeldByLaw
from dashboard.ids import Model, find_owned
from dashboard.refusals import FieldError

NO_TOKEN = "This form has expired or was not sent from this site. Go back and try again."


def save_form(form: FlaskForm, save: Callable[[], Any], *, saved: str, endpoint: str) -> Any:
    """A POST of ``form``: validate it (the CSRF token), then ``save()`` (a service call
    that flushes). Saved: commit, flash ``saved`` and redirect to ``endpoint``. A
    ``FieldError`` goes onto its field, and nothing is committed. ``None``: the caller
    shows the form again, with a 400."""
    if not form.validate_on_submit():
        return None
    try:
        save()
    except FieldError as exc:
        getattr(form, exc.field).errors.append(exc.sentence)
        return None
    db.session.commit()
    flash(saved, "success")
    return redirect(url_for(endpoint))


def same_site_path(target: str | None) -> str | None:
    """``target`` if it is a path on this site, else ``None`` — never an open redirect
    (``//evil``, ``/\\evil``, which browsers read as ``//evil``, a scheme) and never a
    header injection (control characters, which ``urlsplit`` would quietly drop)."""
    if not target or not target.startswith("/") or target.startswith("//") \
            or "\\" in target or any(ord(c) < 0x20 or ord(c) == 0x7F for c in target):
        return None
    parts = urlsplit(target)
    return target if not parts.scheme and not parts.netloc else None


def owned_or_404(session: Session, model: type[Model], raw_id: object, user_id: int,
                 description: str) -> Model:
    """As ``find_owned``, with a 404 saying ``description`` when there is no such row."""
    record = find_owned(session, model, raw_id, user_id)
    if record is None:
        raise NotFound(description)
    return record


def delete_page(*, confirm: Callable[[], Any], delete: Callable[[], None], noun: str,
                endpoint: str) -> Any:
    """Delete one of the user's rows, the same on every page. GET and HEAD: ``confirm()``,
    the page that asks (it changes nothing). POST, with its CSRF token: ``delete()`` (a
    service call that flushes), commit, flash "<noun> deleted."; a legal hold's refusal
    (``HeldByLaw``) deletes nothing and flashes its sentence ("Your account is under a
    legal hold: … cannot be deleted until the hold ends."). Both go back to ``endpoint``
    with 303 See Other."""
    if request.method != "POST":
        return confirm()
    if not FlaskForm().validate_on_submit():  # the token (CSRFProtect checks it first too)
        abort(400, NO_TOKEN)
    try:
        delete()
    except HeldByLaw as exc:
        flash(exc.sentence, "warning")
        return redirect(url_for(endpoint), 303)
    db.session.commit()
    flash(f"{noun} deleted.", "success")
    return redirect(url_for(endpoint), 303)
