"""Documents (/documents/): upload (.txt/.md/.markdown, UTF-8 without NUL, not empty, within
DOCUMENT_MAX_BYTES; a body over MAX_CONTENT_LENGTH answered on the upload page), list,
view (escaped), delete; owner-only; every change requests a build."""

from __future__ import annotations

import io
import logging
import re

import pytest
from sqlalchemy import func, select

from dashboard.documents import services
from dashboard.documents.models import Document
from dashboard.plans.sentences import state_sentence
from dashboard.plans.services import get_plan_for_user, resolve_sources
from dashboard.security import NAMELESS_PART
from dashboard.sources import DOCUMENTS
from tests.conftest import csrf_from
from tests.factories import make_user, queued_triggers, settle

INDEX, VIEW, DELETE = "/documents/", "/documents/view/", "/documents/delete/"
SCRIPT = "<script>alert('doc')</script>"
ESCAPED = "&lt;script&gt;alert(&#39;doc&#39;)&lt;/script&gt;"


def upload(client, data: bytes, filename: str = "notes.txt", **form):
    return client.post(INDEX, data={"csrf_token": csrf_from(client, INDEX),
                                    "file": (io.BytesIO(data), filename), **form},
                       content_type="multipart/form-data")


def document_of(db_session, user, content="text", title="Doc") -> Document:
    document = Document(user_id=user.id, title=title, filename=f"{title}.txt",
                        content_type="text/plain", content=content)
    db_session.add(document)
    db_session.flush()
    return document


def documents(db_session, user) -> list[Document]:
    db_session.expire_all()
    return list(db_session.scalars(select(Document).where(Document.user_id == user.id)))


def test_guests_are_sent_to_sign_in(client):
    for path in (INDEX, f"{VIEW}?id=1", f"{DELETE}?id=1"):
        response = client.get(path)
        assert response.status_code == 302, path
        assert response.headers["Location"].startswith("/auth/signin"), path


def test_the_page_says_documents_are_off_unless_an_administrator_switches_them_on(
        client, db_session, user):
    resolution = resolve_sources(get_plan_for_user(user, db_session))
    source = resolution.get(DOCUMENTS)
    assert source.state.value == "not_assigned_by_default"
    html = client.get(INDEX).get_data(as_text=True)
    assert state_sentence(source, resolution) in html
    assert "up to 1 MiB" in html
    assert 'enctype="multipart/form-data"' in html


@pytest.mark.parametrize("filename, content_type", [
    ("notes.txt", "text/plain"), ("README.MD", "text/markdown"),
    ("guide.markdown", "text/markdown"), ("folder/plan.txt", "text/plain"),
])
def test_upload_keeps_text_and_markdown_and_requests_a_build(client, db_session, user,
                                                            filename, content_type):
    settle(db_session)
    response = upload(client, "# Heading\n\nCafé ☕\n".encode(), filename)
    assert response.status_code == 302
    assert response.headers["Location"] == "/documents/"
    [document] = documents(db_session, user)
    assert document.content == "# Heading\n\nCafé ☕\n"
    assert document.content_type == content_type
    assert document.filename == filename.rsplit("/", 1)[-1]
    assert document.title == document.filename.rsplit(".", 1)[0]
    assert queued_triggers(db_session, user) == ["content_change"]


def test_upload_takes_a_title_and_drops_a_byte_order_mark(client, db_session, user):
    assert upload(client, b"\xef\xbb\xbfhello", "a.txt", title="  My   notes ").status_code \
        == 302
    [document] = documents(db_session, user)
    assert (document.title, document.content) == ("My notes", "hello")


@pytest.mark.parametrize("data, filename, error", [
    (b"hello", "photo.png", "its name must end in .txt, .md or .markdown"),
    (b"hello", "page.html", "its name must end in .txt, .md or .markdown"),
    (b"hello", "Makefile", "its name must end in .txt, .md or .markdown"),
    (b"hello", ".md", "its name must end in .txt, .md or .markdown"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "sneaky.txt", "it holds NUL bytes"),
    (b"caf\xe9 latin-1", "latin.txt", "That file is not UTF-8 text."),
    (b"\xed\xa0\x80 surrogate", "bad.md", "That file is not UTF-8 text."),
    (b"", "empty.txt", "That file is empty"),
    (b" \n\t\n", "blank.md", "That file is empty"),
    (b"\xef\xbb\xbf", "bom-only.txt", "That file is empty"),
])
def test_upload_refuses_what_is_not_text_as_a_form_error(client, db_session, user, data,
                                                        filename, error):
    settle(db_session)
    response = upload(client, data, filename)
    assert response.status_code == 400
    html = response.get_data(as_text=True)
    assert error in html and "invalid-feedback" in html
    assert documents(db_session, user) == []
    assert queued_triggers(db_session, user) == []


def test_upload_without_a_file_is_a_form_error(client, db_session, user):
    response = client.post(INDEX, data={"csrf_token": csrf_from(client, INDEX), "title": "x"},
                           content_type="multipart/form-data")
    assert response.status_code == 400
    assert "Choose a file to upload." in response.get_data(as_text=True)


@pytest.mark.parametrize("part", [
    'Content-Disposition: form-data; filename="notes.txt"\r\nContent-Type: text/plain',
    "Content-Disposition: form-data",
    'Content-Disposition: form-data; name=""; filename="notes.txt"',
    'Content-Disposition: attachment; filename="notes.txt"',
], ids=["file", "field", "empty name", "attachment"])
def test_a_part_without_a_name_is_a_clear_400_and_stores_nothing(client, db_session, user,
                                                                  part, caplog):
    body = (f"--b\r\nContent-Disposition: form-data; name=\"csrf_token\"\r\n\r\n"
            f"{csrf_from(client, INDEX)}\r\n--b\r\n{part}\r\n\r\nhello\r\n"
            f"--b\r\nContent-Disposition: form-data; name=\"title\"\r\n\r\nT\r\n--b--\r\n")
    response = client.post(INDEX, data=body.encode(),
                           content_type="multipart/form-data; boundary=b")
    assert (response.status_code, NAMELESS_PART in response.get_data(as_text=True)) == \
        (400, True)
    assert documents(db_session, user) == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_title_too_long_is_a_form_error(client, db_session, user):
    response = upload(client, b"hello", "a.txt", title="t" * 201)
    assert response.status_code == 400
    assert "Use at most 200 characters for the title." in response.get_data(as_text=True)
    assert documents(db_session, user) == []


def test_upload_is_limited_by_document_max_bytes(app, client, db_session, user, monkeypatch):
    monkeypatch.setitem(app.config, "DOCUMENT_MAX_BYTES", 2048)
    response = upload(client, b"x" * 2049, "big.txt")
    assert response.status_code == 400
    html = response.get_data(as_text=True)
    assert "That file is too large: a document can be at most 2 KiB." in html
    assert documents(db_session, user) == []
    assert upload(client, b"x" * 2048, "exact.txt").status_code == 302
    assert len(documents(db_session, user)) == 1


def test_the_default_limit_is_one_mebibyte(app, client, db_session, user, monkeypatch):
    monkeypatch.delitem(app.config, "DOCUMENT_MAX_BYTES", raising=False)
    response = upload(client, b"x" * (1024 * 1024 + 1), "big.txt")
    assert response.status_code == 400
    assert "a document can be at most 1 MiB." in response.get_data(as_text=True)


def test_a_body_over_max_content_length_is_answered_on_the_upload_page(
        app, client, db_session, user, monkeypatch):
    token = csrf_from(client, INDEX)
    monkeypatch.setitem(app.config, "MAX_CONTENT_LENGTH", 4096)
    response = client.post(INDEX, data={"csrf_token": token,
                                        "file": (io.BytesIO(b"y" * 8192), "huge.txt")},
                           content_type="multipart/form-data")
    assert response.status_code == 413
    html = response.get_data(as_text=True)
    assert "That file is too large: a document can be at most 4 KiB." in html
    assert "Upload a document" in html and 'name="csrf_token"' in html
    assert documents(db_session, user) == []


def test_a_guest_over_max_content_length_is_sent_to_sign_in(app, client, monkeypatch):
    token = csrf_from(client, "/auth/signin")
    monkeypatch.setitem(app.config, "MAX_CONTENT_LENGTH", 1024)
    response = client.post(INDEX, data={"csrf_token": token,
                                        "file": (io.BytesIO(b"y" * 4096), "huge.txt")},
                           content_type="multipart/form-data")
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/auth/signin")


def test_upload_without_the_csrf_token_is_400(client, db_session, user):
    response = client.post(INDEX, data={"file": (io.BytesIO(b"hello"), "a.txt")},
                           content_type="multipart/form-data")
    assert response.status_code == 400
    assert documents(db_session, user) == []


def test_the_list_shows_only_the_users_documents_newest_first(client, db_session, user):
    document_of(db_session, make_user(db_session), title="Theirs")
    document_of(db_session, user, content="a" * 1536, title="Older")
    document_of(db_session, user, title="Newer")
    html = client.get(INDEX).get_data(as_text=True)
    assert "Theirs" not in html
    assert html.index("Newer") < html.index("Older")
    assert "1.5 KiB" in html


def test_view_shows_the_text_escaped(client, db_session, user):
    document = document_of(db_session, user, content=f"# Title\n{SCRIPT}", title=SCRIPT)
    for path in (INDEX, f"{VIEW}?id={document.id}", f"{DELETE}?id={document.id}"):
        response = client.get(path)
        assert response.status_code == 200, path
        html = response.get_data(as_text=True)
        assert ESCAPED in html, path
        assert SCRIPT not in html, path
    assert "# Title" in client.get(f"{VIEW}?id={document.id}").get_data(as_text=True)


def test_delete_asks_first_then_deletes_and_requests_a_build(client, db_session, user):
    document = document_of(db_session, user, title="Doomed")
    confirm = client.get(f"{DELETE}?id={document.id}")
    assert confirm.status_code == 200
    assert "Delete this document?" in confirm.get_data(as_text=True)
    assert len(documents(db_session, user)) == 1
    settle(db_session)
    response = client.post(f"{DELETE}?id={document.id}",
                           data={"csrf_token": csrf_from(client, INDEX)})
    assert response.status_code == 303
    assert documents(db_session, user) == []
    assert queued_triggers(db_session, user) == ["content_change"]


def test_delete_without_the_csrf_token_is_400(client, db_session, user):
    document = document_of(db_session, user)
    assert client.post(f"{DELETE}?id={document.id}").status_code == 400
    assert len(documents(db_session, user)) == 1


def test_another_users_document_is_404(client, db_session, user):
    document = document_of(db_session, make_user(db_session), content="their secret")
    token = csrf_from(client, INDEX)
    for response in (client.get(f"{VIEW}?id={document.id}"),
                     client.get(f"{DELETE}?id={document.id}"),
                     client.post(f"{DELETE}?id={document.id}", data={"csrf_token": token})):
        assert response.status_code == 404
        assert "their secret" not in response.get_data(as_text=True)
    db_session.expire_all()
    assert db_session.get(Document, document.id) is not None


@pytest.mark.parametrize("raw", ["abc", "-1", "0", "", str(2**31), str(2**64), "%201"])
def test_a_malformed_id_is_404(client, user, raw):
    assert client.get(f"{VIEW}?id={raw}").status_code == 404
    assert client.post(f"{DELETE}?id={raw}",
                       data={"csrf_token": csrf_from(client, INDEX)}).status_code == 404


def test_the_list_costs_the_same_queries_for_1_or_20_documents(client, db_session, user,
                                                              count_queries):
    document_of(db_session, user, title="doc 0")
    client.get(INDEX)
    with count_queries() as one:
        assert client.get(INDEX).status_code == 200
    for n in range(1, 20):
        document_of(db_session, user, title=f"doc {n}")
    with count_queries() as twenty:
        html = client.get(INDEX).get_data(as_text=True)
    assert html.count('data-document-id="') == 20
    assert twenty.count == one.count
    print(f"documents list: {one.count} queries for 1 and for 20 documents")


def test_the_list_never_loads_the_texts(db_session, count_queries):
    user = make_user(db_session)
    document_of(db_session, user, content="the whole text")
    with count_queries() as q:
        page = services.list_documents(db_session, user_id=user.id)
    assert q.count == 1
    columns = q.statements[0].split("FROM")[0].replace("octet_length(documents.content)", "")
    assert not re.search(r"documents\.content\b(?!_type)", columns), columns
    assert page.documents[0].size == len("the whole text")


def test_format_size():
    assert [services.format_size(n) for n in (0, 1, 1023, 1024, 1536, 1024 * 1024)] == \
        ["0 bytes", "1 byte", "1023 bytes", "1 KiB", "1.5 KiB", "1 MiB"]


def test_upload_document_service_refuses_an_extra_byte(db_session):
    user = make_user(db_session)
    with pytest.raises(services.DocumentError):
        services.upload_document(db_session, user_id=user.id, title="", filename="a.txt",
                                 data=b"x" * 11, max_bytes=10)
    assert db_session.scalar(select(func.count()).select_from(Document)
                             .where(Document.user_id == user.id)) == 0
