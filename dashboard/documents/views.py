"""Uploaded documents (text and Markdown): list, upload, view, delete.

Ids travel as ``?id=``: a malformed or foreign id is a 404. The upload limit is
``DOCUMENT_MAX_BYTES`` (default 1 MiB); a request body over the app's
``MAX_CONTENT_LENGTH`` is refused by Werkzeug before any view runs, and this blueprint
answers that 413 with the upload page and a form error rather than a bare error page."""

from __future__ import annotations

from flask import Blueprint, current_app, render_template, request
from flask_login import current_user, login_required
from flask_wtf import FlaskForm
from werkzeug.exceptions import RequestEntityTooLarge
from wtforms import FileField, StringField

from dashboard.documents import services
from dashboard.documents.models import Document
from dashboard.documents.services import MAX_TITLE
from dashboard.extensions import db, login_manager
from dashboard.forms import delete_page, owned_or_404, save_form
from dashboard.plans.web import sentence_for
from dashboard.sources import DOCUMENTS

bp = Blueprint("documents", __name__, url_prefix="/documents")

NOT_FOUND = "There is no such document among yours."
ACCEPT = ".txt,.md,.markdown,text/plain,text/markdown"


class UploadForm(FlaskForm):
    # The service validates; the form only carries values.
    file = FileField("File", render_kw={"accept": ACCEPT})
    title = StringField("Title (optional: the file's name otherwise)",
                        render_kw={"maxlength": MAX_TITLE})


def max_bytes() -> int:
    """The document limit, and never more than a request may carry."""
    limit = int(current_app.config.get("DOCUMENT_MAX_BYTES", services.DEFAULT_MAX_BYTES))
    request_limit = current_app.config.get("MAX_CONTENT_LENGTH")
    return min(limit, int(request_limit)) if request_limit else limit


def _owned(raw_id: object) -> Document:
    return owned_or_404(db.session, Document, raw_id, current_user.id, NOT_FOUND)


def _render_index(form: UploadForm, status: int = 200):
    page = services.list_documents(db.session, user_id=current_user.id,
                                   page=request.args.get("page", 1, type=int))
    source, sentence = sentence_for(current_user, DOCUMENTS)
    return render_template("documents/index.html", form=form, page=page, source=source,
                           sentence=sentence, limit=services.format_size(max_bytes())), status


@bp.route("/", methods=["GET", "POST"])
@login_required
def index():
    """The documents, newest first, with the upload form (POST uploads)."""
    form = UploadForm()
    if request.method != "POST":  # GET and HEAD show; only a POST changes
        return _render_index(form)
    saved = save_form(form, lambda: _upload(form), saved="Document uploaded.",
                      endpoint="documents.index")
    return saved if saved is not None else _render_index(form, 400)


def _upload(form: UploadForm) -> None:
    upload = request.files.get("file")
    limit = max_bytes()
    # One byte past the limit is enough to know it is too large.
    data = upload.stream.read(limit + 1) if upload else b""
    services.upload_document(db.session, user_id=current_user.id, title=form.title.data or "",
                             filename=upload.filename if upload else "", data=data,
                             max_bytes=limit)


@bp.errorhandler(RequestEntityTooLarge)
def too_large(exc: RequestEntityTooLarge):
    """The body was over MAX_CONTENT_LENGTH: the form was never read, so nothing is
    filled in, but the page says what happened and the form is there to try again."""
    if not current_user.is_authenticated:
        return login_manager.unauthorized()
    form = UploadForm(formdata=None)  # request.form would raise the same 413 again
    form.file.errors = [services.too_large_message(max_bytes())]
    return _render_index(form, 413)


@bp.route("/view/")
@login_required
def view():
    document = _owned(request.args.get("id"))
    return render_template("documents/view.html", document=document,
                           size=services.format_size(len(document.content.encode("utf-8"))))


@bp.route("/delete/", methods=["GET", "POST"])
@login_required
def delete():
    """GET asks for confirmation (works without JS); POST deletes (``delete_page``)."""
    document = _owned(request.args.get("id"))
    return delete_page(
        confirm=lambda: render_template("documents/delete.html", document=document),
        delete=lambda: services.delete_document(db.session, document),
        noun="Document", endpoint="documents.index")
