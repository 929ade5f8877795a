from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from flask import abort
from flask_login import current_user

from dashboard.extensions import login_manager

F = TypeVar("F", bound=Callable[..., Any])


def role_required(*roles: str) -> Callable[[F], F]:
    """Signed-out: to the sign-in page. Signed in without the role: 403."""

    def decorator(view: F) -> F:
        @wraps(view)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if not current_user.is_authenticated:
                return login_manager.unauthorized()
            if current_user.role not in roles:
                abort(403)
            return view(*args, **kwargs)

        return wrapped  # type: ignore[return-value]

    return decorator


staff_required = role_required("support", "admin")
admin_required = role_required("admin")
