"""A small DOM from the standard library's HTML parser: enough to find elements by tag,
class and attribute and read their text, so tests check structure rather than substrings."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
        "source", "track", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    parent: Node | None = None
    children: list[Node | str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    @property
    def text(self) -> str:
        """The text inside, as the parser decoded it (entities unescaped)."""
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    @property
    def normalized_text(self) -> str:
        return " ".join(self.text.split())

    def iter(self) -> Iterator[Node]:
        for child in self.children:
            if isinstance(child, Node):
                yield child
                yield from child.iter()

    def find_all(self, tag: str | None = None, cls: str | None = None,
                 **attrs: str | bool) -> list[Node]:
        """Descendants matching ``tag``, having class ``cls``, and every attribute given
        (``True``: present with any value; ``data_op_thread`` means ``data-op-thread``)."""
        found = []
        for node in self.iter():
            if tag and node.tag != tag:
                continue
            if cls and cls not in node.classes:
                continue
            if all(_matches(node, name.replace("_", "-"), value)
                   for name, value in attrs.items()):
                found.append(node)
        return found

    def find(self, tag: str | None = None, cls: str | None = None,
             **attrs: str | bool) -> Node | None:
        matches = self.find_all(tag, cls, **attrs)
        return matches[0] if matches else None


def _matches(node: Node, name: str, value: str | bool) -> bool:
    if value is True:
        return name in node.attrs
    return node.attrs.get(name) == value


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.current = self.root

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: (v if v is not None else "") for k, v in attrs}, self.current)
        self.current.children.append(node)
        if tag not in VOID:
            self.current = node

    def handle_startendtag(self, tag, attrs):
        self.current.children.append(
            Node(tag, {k: (v if v is not None else "") for k, v in attrs}, self.current))

    def handle_endtag(self, tag):
        node = self.current
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.current = node.parent

    def handle_data(self, data):
        self.current.children.append(data)


def parse(html: str) -> Node:
    builder = _Builder()
    builder.feed(html)
    builder.close()
    return builder.root
