"""Sign up, sign in (throttled per account and per client), sign out."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Flask, current_app, flash, redirect, render_template, request, url_for
from flask_limiter.util import get_remote_address
from flask_login import current_user, login_required, login_user, logout_user
from sqlalchemy import func

from dashboard.auth import services
from dashboard.auth.forms import SignInForm, SignUpForm
from dashboard.extensions import db
from dashboard.forms import same_site_path
from dashboard.security import get_limiter

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
    """Sign in with email and password (throttled: ``throttle_signin``)."""
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


# -- the sign-in throttle -------------------------------------------------------------------

def signin_account_key() -> str:
    email = services.normalise_email(request.form.get("email", ""))
    # A key is needed for the check even where nothing will be counted (no email).
    return f"account:{email}" if email else f"anonymous:{get_remote_address()}"


def signin_client_key() -> str:
    return f"client:{get_remote_address()}"


_SIGNIN_REFUSED = "orbitpilot.signin_refused"


def count_failed_signin() -> None:
    """The sign-in view refused this email and password: the attempt counts."""
    request.environ[_SIGNIN_REFUSED] = True


def failed_signin(response: Any) -> bool:
    """Only refused credentials count: not a success, nor a 503 (the database was down:
    counting those locked everyone out once it was back), nor a form refused before any
    password was checked (no CSRF token, a field missing)."""
    return bool(request.environ.get(_SIGNIN_REFUSED))


def throttle_signin(app: Flask) -> None:
    """Wrap the registered sign-in view with its two limits (after ``init_security``)."""
    limiter = get_limiter(app)
    signin_view = app.view_functions["auth.signin"]
    signin_view = limiter.limit(lambda: app.config["SIGNIN_LIMIT_PER_ACCOUNT"],
                                key_func=signin_account_key, methods=["POST"],
                                deduct_when=failed_signin, scope="signin-account")(signin_view)
    signin_view = limiter.limit(lambda: app.config["SIGNIN_LIMIT_PER_CLIENT"],
                                key_func=signin_client_key, methods=["POST"],
                                deduct_when=failed_signin, scope="signin-client")(signin_view)
    app.view_functions["auth.signin"] = signin_view
