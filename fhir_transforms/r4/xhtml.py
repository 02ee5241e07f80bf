"""FHIR narrative XHTML: de-identify the text as rendered and every attribute that can carry text; keep the markup valid."""
from __future__ import annotations

import re
from typing import Sequence

from lxml import etree

from fhir_transforms.r4 import rendered
from fhir_transforms.errors import InputError
from text_deid import replace
from text_deid.spans import Span

PARSER = etree.XMLParser(resolve_entities=False, no_network=True, remove_comments=True, remove_pis=True, huge_tree=False)
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"

# How each attribute the R4 narrative allows is treated; any other attribute is dropped.
TEXT_ATTRIBUTES = frozenset({"title", "alt", "abbr", "summary", "axis", "char", "accesskey", "datetime", "face"})
# names, classes, styles: read by the text stack; kept as they are when it finds nothing, else dropped
# (a [TAG] is not a valid id, class or style)
TOKEN_ATTRIBUTES = frozenset({"id", "name", "class", "headers", "usemap", "coords", "style"})
LINK_ATTRIBUTES = frozenset({"href", "src", "cite"})  # kept only when they point inside the resource ("#..."), then as tokens
NUMBER_ATTRIBUTES = frozenset({"width", "height", "span", "charoff", "rowspan", "colspan", "border", "cellpadding",
                               "cellspacing", "start", "value", "tabindex", "size"})
NUMBER_RE = re.compile(r"\d{1,4}(?:\.\d{1,2})?(?:%|px)?")  # too short for an identifier; a year alone is not PHI
KEYWORD_ATTRIBUTES = {
    "dir": {"ltr", "rtl", "auto"}, "align": {"left", "center", "right", "justify", "char"},
    "valign": {"top", "middle", "bottom", "baseline"}, "scope": {"row", "col", "rowgroup", "colgroup"},
    "frame": {"void", "above", "below", "hsides", "lhs", "rhs", "vsides", "box", "border"},
    "rules": {"none", "groups", "rows", "cols", "all"}, "type": {"1", "a", "A", "i", "I", "disc", "circle", "square"},
    "shape": {"default", "rect", "circle", "poly"}, "nowrap": {"nowrap"},
    "color": {"black", "silver", "gray", "white", "maroon", "red", "purple", "fuchsia", "green", "lime", "olive",
              "yellow", "navy", "blue", "teal", "aqua"},  # the 16 HTML 4 colour names
}
COLOR_RE = re.compile(r"#[0-9A-Fa-f]{3}(?:[0-9A-Fa-f]{3})?")
LANG_RE = re.compile(r"[A-Za-z]{2,3}(?:-[A-Za-z0-9]{2,8})*")  # a BCP 47 tag: language, then region, script, ...


class Narrative:
    """A parsed `div`: its text as rendered (built from its text nodes) and the attribute values the text
    stack reads, and how to write the element back from the spans found in them."""

    def __init__(self, root):
        self.root = root
        self.slots: list[tuple] = []  # (element, "text" | "tail"): the text nodes, keyed by index in the pieces
        self.pieces: list[rendered.Piece] = []
        self.attributes: list[tuple] = []  # (element, attribute, its value is free text)
        self.dropped = False  # an attribute was removed whatever its value
        self._walk(root)
        self.readings = rendered.readings(self.pieces)
        self.texts = [text for text, _ in self.readings] + [el.get(attr) for el, attr, _ in self.attributes]

    @classmethod
    def parse(cls, div: str) -> "Narrative":
        """Parse a div; InputError (never quoting it) when it is not well-formed or declares entities."""
        try:
            root = etree.fromstring(div.encode("utf-8"), PARSER)
        except etree.XMLSyntaxError as e:
            if "Entity" in str(e) and "not defined" in str(e):
                raise InputError("narrative uses an entity XHTML does not define (only the five XML entities and "
                                 "character references, e.g. &#233;, can be read)") from None
            raise InputError("narrative is not well-formed XHTML") from None
        if root.getroottree().docinfo.internalDTD is not None or root.getroottree().docinfo.doctype:
            raise InputError("narrative has a DOCTYPE (FHIR narrative is an XHTML div alone; its entities cannot be read)")
        return cls(root)

    def _walk(self, el) -> None:
        block = el is self.root or etree.QName(el).localname in rendered.BLOCK_ELEMENTS
        self._attributes(el)
        self.pieces.append(rendered.BREAK if block else rendered.JOIN)
        if el.text:
            self._slot(el, "text", el.text)
        for child in el:
            self._walk(child)
            if child.tail:
                self._slot(child, "tail", child.tail)
        self.pieces.append(rendered.BREAK if block else rendered.JOIN)

    def _slot(self, el, where: str, text: str) -> None:
        self.pieces.append(rendered.Piece(len(self.slots), 0, len(text), text))
        self.slots.append((el, where))

    def _attributes(self, el) -> None:
        for attr, value in list(el.attrib.items()):
            name = "lang" if attr == XML_LANG else attr
            if name in TEXT_ATTRIBUTES or name in TOKEN_ATTRIBUTES:
                self.attributes.append((el, attr, name in TEXT_ATTRIBUTES))
            elif name in LINK_ATTRIBUTES and value.startswith("#"):
                self.attributes.append((el, attr, False))
            elif not _keeps(name, value):
                del el.attrib[attr]
                if name not in LINK_ATTRIBUTES:  # links leaving the resource always go (unlabelled, as before)
                    self.dropped = True

    def render(self, found: Sequence[Sequence[Span]]) -> str:
        """The div with what `found` covers masked: in the text nodes, and in (or with) the attributes."""
        n = len(self.readings)
        changes = rendered.edits(self.pieces, self.readings, found[:n])
        for key, slot_changes in changes.items():
            el, where = self.slots[key]
            if where == "text":
                el.text = rendered.apply(el.text, slot_changes)
            else:
                el.tail = rendered.apply(el.tail, slot_changes)
        for (el, attr, is_text), spans in zip(self.attributes, found[n:]):
            if spans and is_text:
                el.set(attr, replace.apply(el.get(attr), list(spans)))
            elif spans:
                del el.attrib[attr]
        return etree.tostring(self.root, encoding="unicode")


def _keeps(name: str, value: str) -> bool:
    """Whether an attribute the text stack does not read is kept: only values that cannot carry PHI."""
    if name in NUMBER_ATTRIBUTES:
        return NUMBER_RE.fullmatch(value) is not None
    if name == "lang":
        return LANG_RE.fullmatch(value) is not None
    if name == "color" and COLOR_RE.fullmatch(value):
        return True
    return value in KEYWORD_ATTRIBUTES.get(name, ())
