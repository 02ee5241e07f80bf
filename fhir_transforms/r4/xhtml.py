"""FHIR narrative XHTML: de-identify the text nodes and keep the markup valid."""
from __future__ import annotations

from lxml import etree

PARSER = etree.XMLParser(resolve_entities=False, no_network=True, remove_comments=True, remove_pis=True, huge_tree=False)
TEXT_ATTRIBUTES = ("title", "alt")
LINK_ATTRIBUTES = ("href", "src")  # kept only when they point inside the resource ("#...")


class Narrative:
    """A parsed `div`: its text nodes (and title/alt attributes) in document order, and how to write them back."""

    def __init__(self, root):
        self.root = root
        self.slots = []  # (element, "text" | "tail" | attribute name)
        for el in root.iter():
            if el.text:
                self.slots.append((el, "text"))
            for attr in TEXT_ATTRIBUTES:
                if el.get(attr):
                    self.slots.append((el, attr))
            for attr in LINK_ATTRIBUTES:
                if el.get(attr) is not None and not el.get(attr).startswith("#"):
                    del el.attrib[attr]
            if el is not root and el.tail:
                self.slots.append((el, "tail"))
        self.texts = [self._get(el, where) for el, where in self.slots]

    @classmethod
    def parse(cls, div: str) -> "Narrative":
        try:
            root = etree.fromstring(div.encode("utf-8"), PARSER)
        except etree.XMLSyntaxError:
            raise ValueError("not well-formed XHTML") from None
        return cls(root)

    @staticmethod
    def _get(el, where: str) -> str:
        return el.text if where == "text" else el.tail if where == "tail" else el.get(where)

    def render(self, replaced: list[str]) -> str:
        for (el, where), value in zip(self.slots, replaced):
            if where == "text":
                el.text = value
            elif where == "tail":
                el.tail = value
            else:
                el.set(where, value)
        return etree.tostring(self.root, encoding="unicode")
