"""YAML with line numbers: every mapping and list remembers where it and each of its keys/items start.

Owns: :func:`load_yaml` (a ``yaml.SafeLoader`` subclass that builds :class:`LineDict` / :class:`LineList`
instead of plain ``dict`` / ``list``, and rejects a key written twice in one mapping), the limits every YAML file
the tool reads is held to before it is built (nesting depth, and the size the document has once its aliases are
expanded: an alias bomb is refused, not grown), and
:func:`line_of`, which turns a location path (``("constraints", 3, "check", "option")``, as pydantic
reports it) into the 1-based line of the deepest node on that path that exists in the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class LineDict(dict):
    """A mapping from YAML: ``.line`` is where it starts, ``.key_lines[key]`` where each key is written."""

    line: int = 0
    key_lines: dict[Any, int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.key_lines = {}


class LineList(list):
    """A sequence from YAML: ``.line`` is where it starts, ``.item_lines[i]`` where item ``i`` starts."""

    line: int = 0
    item_lines: list[int]

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.item_lines = []


class YamlSyntaxError(Exception):
    """The file is not valid YAML (or writes a key twice); ``line`` is 1-based."""

    def __init__(self, line: int, what: str, fix: str = "") -> None:
        super().__init__(what)
        self.line = line
        self.what = what
        self.fix = fix or (
            "fix the YAML near that line: indentation, a missing ':' or an unclosed quote/bracket"
        )


#: libyaml's parser when PyYAML was built with it (same marks, much faster), else the pure-Python one
_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _LineLoader(_BaseLoader):  # type: ignore[misc, valid-type]
    """Safe loader that annotates mappings and sequences with line numbers (1-based)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> LineDict:  # type: ignore[override]
        self.flatten_mapping(node)
        out = LineDict()
        out.line = node.start_mark.line + 1
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise YamlSyntaxError(key_node.start_mark.line + 1, "a mapping key must be a plain value") from None
            if key in out:
                raise YamlSyntaxError(
                    key_node.start_mark.line + 1,
                    f"key {key!r} is written twice in the same mapping (first at line {out.key_lines[key]})",
                    "keep one of the two (YAML would silently use the last one)",
                )
            out[key] = self.construct_object(value_node, deep=True)
            out.key_lines[key] = key_node.start_mark.line + 1
        return out

    def construct_yaml_seq(self, node: yaml.SequenceNode):  # type: ignore[override]
        out = LineList()
        out.line = node.start_mark.line + 1
        yield out
        for child in node.value:
            out.append(self.construct_object(child, deep=True))
            out.item_lines.append(child.start_mark.line + 1)

    def construct_yaml_map(self, node: yaml.MappingNode):  # type: ignore[override]
        yield self.construct_mapping(node, deep=True)


_LineLoader.add_constructor("tag:yaml.org,2002:map", _LineLoader.construct_yaml_map)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _LineLoader.construct_yaml_seq)


MAX_DEPTH = 64  # nesting of mappings and lists
MAX_EXPANDED_NODES = 1_000_000  # nodes once every alias is expanded (a spec or KB file has thousands)


def check_limits(text: str) -> None:
    """Refuse a document nested too deep, or whose aliases expand past :data:`MAX_EXPANDED_NODES`, from its event
    stream (nothing is built): each anchor's expanded size is counted once, each alias adds it again."""
    sizes: dict[str, int] = {}
    stack: list[list] = [[0, None]]  # [expanded nodes so far, anchor] per open collection
    for ev in yaml.parse(text, Loader=_BaseLoader):
        line = ev.start_mark.line + 1 if ev.start_mark is not None else 1
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            stack.append([1, ev.anchor])
            if len(stack) - 1 > MAX_DEPTH:
                raise YamlSyntaxError(line, f"nested deeper than {MAX_DEPTH} levels",
                                      "a spec or knowledge-base file is a few levels deep; flatten it")
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            size, anchor = stack.pop()
            if anchor:
                sizes[anchor] = size
            stack[-1][0] += size
        elif isinstance(ev, yaml.ScalarEvent):
            stack[-1][0] += 1
            if ev.anchor:
                sizes[ev.anchor] = 1
        elif isinstance(ev, yaml.AliasEvent):
            stack[-1][0] += sizes.get(ev.anchor, 1)
        else:
            continue
        if sum(level[0] for level in stack) > MAX_EXPANDED_NODES:
            raise YamlSyntaxError(line, f"the document expands to more than {MAX_EXPANDED_NODES:,} nodes "
                                  "(aliases referring to aliases: a YAML bomb?)",
                                  "write the values out, or use fewer nested aliases")


def parse_yaml(text: str) -> Any:
    """Parse YAML text into LineDict/LineList/scalars. Raises :class:`YamlSyntaxError` with the line."""
    try:
        check_limits(text)
        return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - SafeLoader subclass
    except YamlSyntaxError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        what = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        ctx = exc.context_mark
        if ctx is not None and exc.problem_mark is not None and ctx.line != exc.problem_mark.line:
            what += f" (the construct starts at line {ctx.line + 1})"
        raise YamlSyntaxError(line, f"YAML syntax error: {what}") from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(1, f"YAML error: {exc}") from None


def load_yaml(path: Path) -> Any:
    return parse_yaml(path.read_text(encoding="utf-8"))


def line_of(data: Any, loc: tuple[Any, ...] | list[Any], default: int = 1) -> int:
    """The line of the deepest node on ``loc`` that exists in ``data``.

    Parts of ``loc`` that are not keys/indices of the current node (pydantic adds union tags such as
    ``"value_range"``) are skipped rather than ending the walk.
    """
    node = data
    line = getattr(data, "line", default) or default
    for part in loc:
        if isinstance(node, LineDict) and part in node:
            line = node.key_lines.get(part, line)
            node = node[part]
        elif isinstance(node, LineList) and isinstance(part, int) and 0 <= part < len(node):
            line = node.item_lines[part]
            node = node[part]
        else:
            continue
    return line


def node_at(data: Any, loc: tuple[Any, ...] | list[Any]) -> Any:
    """The node on ``loc`` (skipping parts that do not exist, like :func:`line_of`)."""
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
    return node
