"""Sign up, sign in, sign out."""

from __future__ import annotations

from flask import Blueprint, current_app, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required, login_user, logout_user
from sqlalchemy import func

from dashboard.auth import services
from dashboard.auth.forms import SignInForm, SignUpForm
from dashboard.extensions import db
from dashboard.forms import same_site_path
from dashboard.security import count_failed_signin

bp = Blueprint("auth", __name__, url_prefix="/auth")


def load_user(user_id: str):
    """Flask-Login's loader: one query per request."""
    return services.active_user(db.session, user_id)


def _safe_next(target: str | None) -> str:
    """Only same-site paths: an open redirect would make sign-in a phishing tool."""
    return same_site_path(target) or url_for("main.index")


@bp.route("/signup", methods=["GET", "POST"])
def signup():
    """Create an account on the default (free) plan."""
    if current_user.is_authenticated:
        return redirect(url_for("main.index"))
    form = SignUpForm()
    if form.validate_on_submit():
        try:
            user = services.create_user(
                db.session,
                email=form.email.data,
                password=form.password.data,
                display_name=form.display_name.data or "",
                min_password_length=current_app.config["PASSWORD_MIN_LENGTH"],
            )
        except services.AccountError as exc:
            # Nothing was written: create_user checks before it adds.
            getattr(form, exc.field or "email").errors.append(exc.sentence)
        else:
            db.session.commit()
            login_user(user)
            flash("Welcome to OrbitPilot. Your account is on the Free plan.", "success")
            return redirect(url_for("main.index"))
    status = 400 if request.method == "POST" else 200
    return render_template("auth/signup.html", form=form), status


@bp.route("/signin", methods=["GET", "POST"])
def signin():
    """Sign in with email and password (throttled: see ``security.init_security``)."""
    if current_user.is_authenticated:
        return redirect(_safe_next(request.args.get("next")))
    form = SignInForm()
    if form.validate_on_submit():
        user = services.authenticate(db.session, form.email.data, form.password.data)
        if user is None or not user.is_active:
            count_failed_signin()
            form.password.errors.append("That email and password don't match an account.")
        else:
            login_user(user, remember=bool(form.remember.data))
            user.last_login_at = func.now()
            db.session.commit()
            return redirect(_safe_next(request.args.get("next")))
    status = 400 if request.method == "POST" else 200
    return render_template("auth/signin.html", form=form), status


@bp.route("/signout", methods=["POST"])
@login_required
def signout():
    """Sign out (POST only, CSRF-protected, so a link elsewhere can't sign you out)."""
    logout_user()
    flash("You are signed out.", "info")
    return redirect(url_for("auth.signin"))
