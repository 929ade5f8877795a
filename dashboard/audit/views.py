"""The audit log in the staff console: read-only, filterable, exportable as CSV, and paged by
keyset (``before_seq`` / ``after_seq``: one index range read a page, whatever the log's
size; docs/architecture/audit.md). It shows what the events hold and looks nothing up
elsewhere, so no page of it can show content."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from flask import abort, request, url_for
from flask_admin.contrib.sqla.filters import BaseSQLAFilter, FilterEqual
from markupsafe import Markup
from sqlalchemy import Integer, String, column, select, table

from dashboard.audit.actions import ACTIONS, MODES
from dashboard.audit.models import AuditEvent
from dashboard.extensions import db
from dashboard.ids import INT8_MAX, parse_int
from dashboard.staff import LONG_RUN, CodeEquals, ReadOnlyView, abbreviated, utc_text

PAGE_SIZE = 50
# One export is a bounded read held in memory as ORM rows; an older slice is exported
# from an "Older" page (the export keeps the page's position and filters).
EXPORT_MAX_ROWS = 10_000
CURSOR_ARGS = ("before_seq", "after_seq")
_PAGE_KEY = "orbitpilot.audit_page"
_EMAILS_KEY = "orbitpilot.audit_actor_emails"
# The accounts table by name: the audit log is written by the accounts package, so it
# must not import it (that would be a circle).
_USERS = table("users", column("id", Integer), column("email", String))
# A spreadsheet runs a cell that starts with one of these as a formula (OWASP's list).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_LIST_VALUE_CHARS = 60
ACTOR_TYPES = ("admin", "support", "user", "api_key", "system")


# -- filters --------------------------------------------------------------------------------
# Exact matches and ranges only: each equality is answered by an index ending in ``seq``.
# Flask-Admin would also offer "contains" on text columns, a scan of the whole log per
# page. The date filters are the exception to "one range read": ``occurred_at`` is not
# part of the ``seq`` order, so "before <a date deep in the log>" walks ``seq`` down past
# every newer event (93 ms at 1,000,000 events, half of them newer); a narrow "between"
# uses the ``occurred_at`` index and stays under a millisecond.

class IdEquals(FilterEqual):
    """An integer id within PostgreSQL's bigint range (beyond it: 400, not a 500)."""

    def validate(self, value: Any) -> bool:
        return parse_int(value, 0, INT8_MAX) is not None

    def clean(self, value: str) -> int:
        return int(value)


_DATETIME_FORMATS = ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d")


def parse_utc(value: str) -> datetime:
    """``YYYY-MM-DD HH:MM:SS`` (what Flask-Admin's picker sends) or ``YYYY-MM-DD``, in
    UTC — the zone the list shows times in. ``ValueError`` otherwise."""
    for fmt in _DATETIME_FORMATS:
        try:
            return datetime.strptime(value.strip(), fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    raise ValueError(f"not a date: {value!r}")


class _DateFilter(BaseSQLAFilter):
    def __init__(self, column: Any, name: str) -> None:
        super().__init__(column, name, data_type="datetimepicker")

    def clean(self, value: str) -> datetime:
        return parse_utc(value)


class DateAfter(_DateFilter):
    def apply(self, query: Any, value: datetime, alias: Any = None) -> Any:
        return query.filter(self.get_column(alias) > value)

    def operation(self) -> str:
        return "after"


class DateBefore(_DateFilter):
    def apply(self, query: Any, value: datetime, alias: Any = None) -> Any:
        return query.filter(self.get_column(alias) < value)

    def operation(self) -> str:
        return "before"


class DateBetween(BaseSQLAFilter):
    """``<start> to <end>``, both included, start not after end."""

    def __init__(self, column: Any, name: str) -> None:
        super().__init__(column, name, data_type="datetimerangepicker")

    def clean(self, value: str) -> tuple[datetime, datetime]:
        parts = value.split(" to ")
        if len(parts) != 2:
            raise ValueError("a range is '<start> to <end>'")
        start, end = parse_utc(parts[0]), parse_utc(parts[1])
        if start > end:
            raise ValueError("the range ends before it starts")
        return start, end

    def apply(self, query: Any, value: tuple[datetime, datetime], alias: Any = None) -> Any:
        start, end = value
        return query.filter(self.get_column(alias).between(start, end))

    def operation(self) -> str:
        return "between"


# -- cells ------------------------------------------------------------------------------------

def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"),
                      default=str)


def _spaced(value: Any) -> str:
    """JSON as the list shows it: with a space after each comma and colon, so that a long
    value wraps between its parts rather than inside a word."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(", ", ": "),
                      default=str)


def _short(text: str, limit: int = _LIST_VALUE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def details_summary(details: Any) -> list[str]:
    """One short line per fact: ``key: before → after`` for each changed setting, then
    ``key: value`` for the other keys. JSON spelling keeps null, numbers and strings
    apart (``"3"`` is not ``3``)."""
    if not isinstance(details, dict) or not details:
        return [] if details in (None, {}) else [_short(_spaced(details))]
    lines = []
    before, after = details.get("before"), details.get("after")
    if isinstance(before, dict) or isinstance(after, dict):
        before = before if isinstance(before, dict) else {}
        after = after if isinstance(after, dict) else {}
        for key in dict.fromkeys([*before, *after]):
            old = _short(_spaced(before[key])) if key in before else "—"
            new = _short(_spaced(after[key])) if key in after else "—"
            lines.append(f"{key}: {old} → {new}")
    elif "before" in details or "after" in details:
        lines.append(f"{_short(_spaced(before))} → {_short(_spaced(after))}")
    for key, value in details.items():
        if key not in ("before", "after"):
            lines.append(f"{key}: {_short(_spaced(value))}")
    return lines


def _words(line: str) -> Markup:
    """A line's words, a long one (an id, a dotted code) cut short with its whole on
    hover: the column stays narrow and breaks no word."""
    return Markup(" ").join(abbreviated(word) if len(word) > LONG_RUN else word
                            for word in line.split(" "))


def _details_list(view: Any, context: Any, model: AuditEvent, name: str) -> Markup:
    lines = details_summary(model.details)
    return Markup("<br>").join(Markup("<code>{}</code>").format(_words(line))
                               for line in lines)


def _details_full(view: Any, context: Any, model: AuditEvent, name: str) -> Markup:
    text = json.dumps(model.details, ensure_ascii=False, sort_keys=True, indent=2,
                      default=str)
    return Markup("<pre class=\"mb-0\">{}</pre>").format(text)


def _pair(kind: str | None, ident: str | None) -> str:
    if kind is None:
        return ident or ""
    return f"{kind}:{ident}" if ident is not None else kind


PEOPLE = ("admin", "support", "user")


def _actor(view: Any, context: Any, model: AuditEvent, name: str) -> Any:
    """A person by email, linked to their support trace (the page's emails are read in
    one query, ``get_list``); a key, the system or someone since deleted by kind and id."""
    emails = request.environ.get(_EMAILS_KEY, {})
    if model.actor_type in PEOPLE and model.actor_id and model.actor_id.isdigit():
        email = emails.get(int(model.actor_id))
        if email:
            return Markup('<a href="{}" title="{}">{}</a>').format(
                url_for("support.trace", user_id=int(model.actor_id)),
                _pair(model.actor_type, model.actor_id), abbreviated(email))
    return _pair(model.actor_type, model.actor_id)


def _action(view: Any, context: Any, model: AuditEvent, name: str) -> Any:
    """The action in words, its code small beside (an older release's code as it is)."""
    words = ACTIONS.get(model.action)
    if words is None:
        return model.action
    return Markup('{}<br><code class="small text-muted">{}</code>').format(words, model.action)


def _target(view: Any, context: Any, model: AuditEvent, name: str) -> str:
    return _pair(model.target_type, model.target_id)


def _hash_short(view: Any, context: Any, model: AuditEvent, name: str) -> Markup:
    return Markup("<code>{}…</code>").format(model.hash[:12])


def _hash_full(view: Any, context: Any, model: AuditEvent, name: str) -> Markup:
    return Markup("<code>{}</code>").format(getattr(model, name))


def neutralise(value: Any) -> Any:
    """A text cell a spreadsheet would run as a formula gets a leading apostrophe."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


# -- keyset paging ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Cursor:
    before_seq: int | None = None
    after_seq: int | None = None

    @classmethod
    def from_args(cls, args: Any) -> Cursor:
        """The position in the address; a malformed one is a 400."""
        values: dict[str, int] = {}
        for name in CURSOR_ARGS:
            raw = args.get(name)
            if raw is None:
                continue
            value = parse_int(raw, 0, INT8_MAX)
            if value is None:
                abort(400, f"The “{name}” value in the address is not valid.")
            values[name] = value
        if len(values) > 1:
            abort(400, "A page is either before or after a position, not both.")
        return cls(**values)

    def as_args(self) -> dict[str, int | None]:
        return {"before_seq": self.before_seq, "after_seq": self.after_seq}


@dataclass(frozen=True)
class KeysetPage:
    """What the pager needs: the page's ends in display order and which ways go on."""

    newest_first: bool
    cursor: Cursor
    first_seq: int | None
    last_seq: int | None
    has_next: bool
    has_previous: bool


def with_args(url: str, **changes: Any) -> str:
    """``url`` with the query arguments in ``changes`` replaced (``None`` removes one)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
             if k not in changes]
    query += [(k, str(v)) for k, v in changes.items() if v is not None]
    return urlunsplit(parts._replace(query=urlencode(query)))


class AuditEventView(ReadOnlyView):
    list_template = "admin/audit/list.html"
    page_size = PAGE_SIZE
    can_set_page_size = False
    column_default_sort = ("seq", True)
    simple_list_pager = True
    column_list = ("seq", "occurred_at", "action", "actor", "owner_id", "target", "mode",
                   "details", "hash")
    column_sortable_list = ("seq",)
    column_labels = {"seq": "Seq", "occurred_at": "When", "owner_id": "Owner id",
                     "actor_type": "Actor type", "actor_id": "Actor id",
                     "target_type": "Target type", "target_id": "Target id",
                     "prev_hash": "Previous hash", "id": "Event id"}
    column_details_list = ("id", "seq", "occurred_at", "action", "actor_type", "actor_id",
                           "owner_id", "target_type", "target_id", "mode", "details",
                           "prev_hash", "hash")
    column_formatters = {
        "action": _action,
        "actor": _actor,
        "target": _target,
        "details": _details_list,
        "hash": _hash_short,
    }
    column_formatters_detail = {
        "details": _details_full,
        "prev_hash": _hash_full,
        "hash": _hash_full,
    }
    named_filter_urls = True
    column_filters = (
        CodeEquals(AuditEvent.action, "Action", max_length=64, choices=ACTIONS,
                   strict=False),
        CodeEquals(AuditEvent.mode, "Mode", max_length=16, choices=MODES,
                   strict=False),
        CodeEquals(AuditEvent.actor_type, "Actor type", max_length=16, choices=ACTOR_TYPES),
        CodeEquals(AuditEvent.actor_id, "Actor id", max_length=64),
        IdEquals(AuditEvent.owner_id, "Owner id"),
        CodeEquals(AuditEvent.target_type, "Target type", max_length=32),
        CodeEquals(AuditEvent.target_id, "Target id", max_length=64),
        DateBetween(AuditEvent.occurred_at, "Date"),
        DateAfter(AuditEvent.occurred_at, "Date"),
        DateBefore(AuditEvent.occurred_at, "Date"),
    )
    can_export = True
    export_types = ["csv"]
    export_max_rows = EXPORT_MAX_ROWS
    column_export_list = ("seq", "occurred_at", "action", "actor_type", "actor_id",
                          "owner_id", "target_type", "target_id", "mode", "details",
                          "prev_hash", "hash")
    column_formatters_export = {
        "occurred_at": lambda v, c, m, n: utc_text(m.occurred_at, precise=True),
        "details": lambda v, c, m, n: _json(m.details),
    }

    # -- requests ----------------------------------------------------------------------
    # Create, edit and delete pages are 404 and actions 400 for every read-only view
    # (StaffModelView._handle_view, after the role gate).

    def _get_list_extra_args(self) -> Any:
        args = super()._get_list_extra_args()  # page, page_size, sort, desc, filters
        if args.page:
            abort(400, "This list pages with its Older and Newer links, not page numbers.")
        if args.sort is not None and self._get_column_by_idx(args.sort)[0] != "seq":
            abort(400, "This list can only be sorted by its sequence number.")
        Cursor.from_args(request.args)
        # The position is not one of the list's settings: links made from them (sort,
        # filters, "reset") start again from the newest event; the pager adds it back.
        for name in CURSOR_ARGS:
            args.extra_args.pop(name, None)
        return args

    def get_list(self, page: int | None, sort_column: Any, sort_desc: bool,
                 search: str | None, filters: Any, execute: bool = True,
                 page_size: int | None = None) -> tuple[None, Any]:
        """One page of events past the cursor, newest first unless sorted ascending.

        The query runs in the direction that walks away from the cursor (so it is an
        index range read) and asks for one row more than it shows, to know whether a
        further page exists without counting."""
        cursor = Cursor.from_args(request.args)
        newest_first = sort_column is None or bool(sort_desc)
        query = self.get_query()
        if filters and self._filters:
            query, _, _, _ = self._apply_filters(query, None, {}, {}, filters)
        seq = AuditEvent.seq
        if cursor.before_seq is not None:
            query, descending = query.filter(seq < cursor.before_seq), True
        elif cursor.after_seq is not None:
            query, descending = query.filter(seq > cursor.after_seq), False
        else:
            descending = newest_first
        query = query.order_by(seq.desc() if descending else seq.asc())
        limit = page_size or self.page_size
        if not execute:
            return None, query.limit(limit)
        rows = query.limit(limit + 1).all()
        more = len(rows) > limit
        rows = rows[:limit]
        walked_back = descending != newest_first
        if walked_back:
            rows.reverse()
        moved = cursor != Cursor()
        people = {int(r.actor_id) for r in rows if r.actor_type in PEOPLE and r.actor_id
                  and r.actor_id.isdigit() and len(r.actor_id) < 10}
        request.environ[_EMAILS_KEY] = dict(db.session.execute(
            select(_USERS.c.id, _USERS.c.email).where(_USERS.c.id.in_(people))).all()) \
            if people else {}
        request.environ[_PAGE_KEY] = KeysetPage(
            newest_first=newest_first, cursor=cursor,
            first_seq=rows[0].seq if rows else None,
            last_seq=rows[-1].seq if rows else None,
            # Walking back, the cursor itself was a row of the page beyond.
            has_next=moved if walked_back else more,
            has_previous=more if walked_back else moved,
        )
        return None, rows

    def render(self, template: str, **kwargs: Any) -> Any:
        page = request.environ.get(_PAGE_KEY)
        if template == self.list_template and page is not None:
            base = kwargs["return_url"]
            kwargs["pager"] = self._pager(base, page)
            # "Back" from a record returns to this page, not to the newest one.
            kwargs["return_url"] = with_args(base, **page.cursor.as_args())
        return super().render(template, **kwargs)

    def _pager(self, base: str, page: KeysetPage) -> dict[str, Any]:
        forward, backward = ("before_seq", "after_seq") if page.newest_first \
            else ("after_seq", "before_seq")
        later, earlier = ("Older", "Newer") if page.newest_first else ("Newer", "Older")
        return {
            "start_label": "Newest" if page.newest_first else "Oldest",
            "start_url": base if page.cursor != Cursor() else None,
            "previous_label": earlier,
            "previous_url": with_args(base, **{backward: page.first_seq})
            if page.has_previous and page.first_seq is not None else None,
            "next_label": later,
            "next_url": with_args(base, **{forward: page.last_seq})
            if page.has_next and page.last_seq is not None else None,
        }

    # -- export ------------------------------------------------------------------------

    def get_export_columns(self) -> list[tuple[str, str]]:
        # The header row names the columns as the table does: a file for tools, not people.
        return [(name, name) for name in self.column_export_list]

    def get_export_value(self, model: Any, name: Any) -> Any:
        return neutralise(super().get_export_value(model, name))

    def get_export_name(self, export_type: str = "csv") -> str:
        return f"audit-log_{datetime.now(UTC):%Y-%m-%d_%H-%M-%S}.{export_type}"
