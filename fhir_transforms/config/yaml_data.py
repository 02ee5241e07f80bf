"""YAML as plain data: no anchors or aliases (an alias bomb grows exponentially), no tags beyond YAML's own
(PyYAML's safe constructors), and at most MAX_DEPTH levels of nesting (deeper ends in a RecursionError).

`compose` returns the node tree, for readers that want each key's line; `load` returns the data. Either
raises yaml.YAMLError with the line of the problem in its `problem_mark`.
"""
from __future__ import annotations

import yaml

MAX_DEPTH = 64


class DataLoader(yaml.SafeLoader):
    """A SafeLoader that refuses aliases and anchors, nesting deeper than MAX_DEPTH, and unknown tags."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in this file",
                                              event.start_mark)
        event = self.peek_event()
        if getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(None, None, "anchors (&name) are not allowed in this file",
                                              event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  event.start_mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if node.tag not in self.yaml_constructors:  # an explicit tag the safe constructors do not know
            raise yaml.constructor.ConstructorError(None, None, f"unknown tag {node.tag[:64]!r}", node.start_mark)
        return node


def compose(text: str) -> yaml.Node | None:
    """The node tree of one YAML document (None for an empty one)."""
    loader = DataLoader(text)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


def construct_scalar(node: yaml.Node):
    """The value of a scalar node, as the safe loader reads it."""
    return DataLoader("").construct_object(node)


def load(text: str):
    """The data of one YAML document."""
    loader = DataLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
