"""Reading and showing text that someone else may have written, within bounds.

A project config, a URL file or a query file may come from anyone: a few hundred bytes of YAML
whose anchors nest ("billion laughs") stand for billions of values once expanded, and anything
that walks them (a validator, `repr`, `str`) runs for minutes. `load_yaml` composes the document,
counts the values it stands for with each alias counted as often as it is used (one pass over the
distinct nodes, so the count itself never expands anything), and refuses a document over
`max_values`, nested deeper than MAX_DEPTH, or recursive, before any Python object is built.
`read_yaml_file` reads a file for it, never more than a bound of bytes. Every refusal is one line
(`BoundedTextError`).

`shown` is a value as an error message quotes it: a bounded prefix of its repr, computed without
walking more of it than it shows, and `cut` bounds a text kept or logged, with a marker saying
how much was left out.
"""

from __future__ import annotations

import re
import reprlib
from pathlib import Path
from typing import Any

import yaml

# Deeper than any config needs (a project config is four levels deep), shallow enough that no
# walk of it, ours or a library's, meets Python's recursion limit.
MAX_DEPTH = 32
SHOWN_CHARS = 200
CUT_MARKER = "... [cut: {hidden:,} more characters]"

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class BoundedTextError(ValueError):
    """Text refused by a bound; the message is one line that names where."""


class NotYaml(BoundedTextError):
    """The text is not YAML at all (a file of plain lines may be meant)."""


class TooLarge(BoundedTextError):
    """The file is larger than the most that is read of it."""


def read_yaml_file(path: Path, *, max_bytes: int, max_values: int) -> Any:
    """The YAML document in the file at `path`, read through `load_yaml`: BoundedTextError (one
    line; the caller names the file) when the file is larger than `max_bytes` (TooLarge, found
    without reading more than that), not UTF-8, or refused by `load_yaml`. OSError when it cannot
    be read."""
    with Path(path).open("rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TooLarge(f"larger than {max_bytes / 2**20:g} MB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BoundedTextError(f"not UTF-8 text (byte {exc.start})") from None
    return load_yaml(text, max_values=max_values)


def load_yaml(text: str, *, max_values: int) -> Any:
    """The YAML document `text` as Python values, or BoundedTextError (one line) when it is not
    YAML (NotYaml), stands for more than `max_values` values once its aliases are expanded, nests deeper
    than MAX_DEPTH or refers to itself."""
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise BoundedTextError(f"nested deeper than {MAX_DEPTH} levels") from None
        except yaml.YAMLError as exc:
            raise NotYaml(_one_line_yaml_error(exc)) from None
        if node is None:
            return None
        _check_expansion(node, max_values)
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as exc:
            raise NotYaml(_one_line_yaml_error(exc)) from None
        except (ValueError, TypeError, OverflowError) as exc:  # e.g. an integer of 10,000 digits
            raise BoundedTextError(
                f"a value cannot be read: {cut(_first_line(str(exc)), 80)}"
            ) from None
    finally:
        loader.dispose()


def _check_expansion(root: yaml.Node, max_values: int) -> None:
    """Refuse a node graph that expands past `max_values`, nests past MAX_DEPTH or has a cycle.
    Sizes are memoised per node, so an alias used a billion times costs one lookup each use."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()

    def size(node: yaml.Node, depth: int, path: tuple[str, ...]) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        if depth > MAX_DEPTH:
            raise BoundedTextError(f"{_where(path)}nested deeper than {MAX_DEPTH} levels")
        if id(node) in on_path:
            raise BoundedTextError(f"{_where(path)}an alias refers to the value that holds it")
        on_path.add(id(node))
        total = 1
        if isinstance(node, yaml.SequenceNode):
            for index, child in enumerate(node.value):
                total += size(child, depth + 1, (*path, str(index)))
                if total > max_values:
                    break
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                total += size(key, depth + 1, path)
                name = key.value if isinstance(key, yaml.ScalarNode) else "?"
                total += size(value, depth + 1, (*path, _shown_key(name)))
                if total > max_values:
                    break
        on_path.discard(id(node))
        if total > max_values:
            raise BoundedTextError(
                f"{_where(path)}holds more than {max_values:,} values (each YAML alias "
                "counted as often as it is used)"
            )
        sizes[id(node)] = total
        return total

    size(root, 0, ())


def _where(path: tuple[str, ...]) -> str:
    shown_path = path if len(path) <= 6 else (*path[:6], "...")
    return f"{'.'.join(shown_path)}: " if path else ""


def _shown_key(name: Any) -> str:
    text = str(name)
    return text if len(text) <= 40 and text.isprintable() else repr(text[:40]) + "..."


def _one_line_yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or _first_line(str(exc))
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"not valid YAML{where}: {cut(problem, SHOWN_CHARS)}"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


_bounded_repr = reprlib.Repr()
_bounded_repr.maxlevel = 3
_bounded_repr.maxstring = SHOWN_CHARS
_bounded_repr.maxother = SHOWN_CHARS
_bounded_repr.maxlong = 60
for _kind in ("maxlist", "maxtuple", "maxdict", "maxset", "maxfrozenset", "maxdeque", "maxarray"):
    setattr(_bounded_repr, _kind, 8)


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """`value` as an error message quotes it: its repr, at most about `limit` characters, built
    from a few items of each level (never the whole of a long or deeply shared value), with the
    size of what is not shown."""
    text = _bounded_repr.repr(value)
    size = ""
    if isinstance(value, str) and len(repr(value[: limit + 1])) > limit:
        size = f" ({len(value):,} characters)"
    elif isinstance(value, list | tuple | dict | set | frozenset) and (
        len(text) > limit or "..." in text
    ):
        size = f" ({len(value):,} items)"
    if len(text) > limit:
        text = text[:limit] + "..."
    return text + size


def shown_key(part: Any) -> str:
    """One part of a key's path as an error line names it: a key someone wrote may be long or
    hold line breaks."""
    text = str(part)
    return text if re.fullmatch(r"[\w-]{1,64}", text) else shown(text, 64)


def cut(text: str, limit: int) -> str:
    """`text` as kept or logged: at most `limit` characters and a marker saying how many more
    there were."""
    if len(text) <= limit:
        return text
    return text[:limit] + CUT_MARKER.format(hidden=len(text) - limit)
