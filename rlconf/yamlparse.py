"""Parse a plan's YAML text into ruamel.yaml round-trip objects, within limits no plan comes near.

A plan is a few hundred values nested about five levels deep, written as plain YAML. Anything a
fuzzer (or a pasted file) can do beyond that must end in a located diagnostic, quickly:

- nested aliases (`b: [*a, *a, ...]`, the "billion laughs" document) multiply a few lines into
  billions of values: the values copied through aliases are counted while composing, and capped;
- deep nesting would exhaust Python's recursion limit further down: capped, aliases included;
- tags (`!!python/object/apply:...`, `!include`) never construct anything: they are refused;
- integers longer than Python converts (4300 digits) are refused instead of raising ValueError;
- a repeated key names the line that first set it.

Every refusal and every YAML syntax error becomes a PlanInputError (exit 2) whose diagnostic
points at the offending text, and where the parser reports a second place (the `[` that a list
started with, the first of two duplicate keys) at that one too.
"""

from __future__ import annotations

from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.composer import Composer, MaxDepthExceededError
from ruamel.yaml.constructor import RoundTripConstructor, SafeConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent
from ruamel.yaml.nodes import MappingNode, ScalarNode
from ruamel.yaml.reader import ReaderError
from ruamel.yaml.scanner import Scanner

from rlconf.diagnostics import Diagnostic, PlanInputError, error
from rlconf.sources import Location

# Values that YAML aliases may copy into a plan, in all. `<<: *defaults` merges copy a handful
# each; ten nested `[*a, *a, ...]` lines copy billions. 10,000 copied values take ~0.1 s to walk.
MAX_ALIAS_VALUES = 10_000
# Nesting levels, aliases expanded. A plan nests about 5; deep nesting hits RecursionError later.
MAX_DEPTH = 64
YAML_TAG_PREFIX = "tag:yaml.org,2002:"
# ruamel's plain scanner, also for round-trip loading: its RoundTripScanner keeps comments, which no
# plan needs (positions come from the nodes' marks), at ~1.2 ms of the 45-line preset's 9 ms parse.
# tests/compiler/test_cold_start.py checks that both give the same values, positions and errors.
PLAN_SCANNER = Scanner


class PlanTextError(Exception):
    """Raised while composing or constructing: what to tell the person, and where (0-based)."""

    def __init__(self, code: str, message: str, line: int, col: int, width: int = 1, help: str | None = None,
                 note: str | None = None, related: tuple[int, int, int, str] | None = None):
        super().__init__(message)
        self.code, self.message, self.help, self.note = code, message, help, note
        self.line, self.col, self.width = line, col, width
        self.related = related  # (line, col, width, label) of a second place


class PlanComposer(Composer):
    """ruamel's composer, counting as it goes: the values each node expands to (aliases inside
    included) and its height, so that an alias is charged for what it copies, in O(text) time."""

    def compose_document(self) -> Any:
        self.warn_double_anchors = False  # re-anchoring a name is valid YAML: the later one wins
        self.expanded: dict[int, tuple[int, int]] = {}  # id(node) -> (values, height)
        self.alias_values = 0
        return super().compose_document()

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.parser.check_event(AliasEvent):
            event = self.parser.peek_event()
            node = super().compose_node(parent, index)
            return self._charge_alias(node, event)
        node = super().compose_node(parent, index)
        if isinstance(node, ScalarNode):
            self.expanded[id(node)] = (1, 1)
            return node
        children = [part for pair in node.value for part in pair] if isinstance(node, MappingNode) else node.value
        sizes = [self.expanded[id(child)] for child in children]
        self.expanded[id(node)] = (1 + sum(v for v, _ in sizes), 1 + max((h for _, h in sizes), default=0))
        return node

    def _charge_alias(self, node: Any, event: Any) -> Any:
        mark, name = event.start_mark, event.anchor
        width = len(name) + 1
        if id(node) not in self.expanded:  # the anchored node is still open: it contains its alias
            raise PlanTextError("RL008", f"alias `*{name}` is used inside the value `&{name}` names: a plan cannot "
                                "contain itself", mark.line, mark.column, width,
                                help=f"replace `*{name}` with the values it should repeat")
        values, height = self.expanded[id(node)]
        self.alias_values += values
        if self.alias_values > MAX_ALIAS_VALUES:
            raise PlanTextError(
                "RL008", f"YAML aliases copy more than {MAX_ALIAS_VALUES:,} values into the plan (the limit on values "
                f"copied through `*alias`); `*{name}` alone copies {values:,}",
                mark.line, mark.column, width, note="the limit is passed here",
                help="aliases nested inside lists multiply (a 'billion laughs' document): write the values out, "
                     "or share settings between plans with `base:`")
        if self.depth + height > MAX_DEPTH:
            raise PlanTextError(
                "RL008", f"`*{name}` nests the plan more than {MAX_DEPTH} levels deep (the limit on nesting, aliases "
                "expanded)", mark.line, mark.column, width, help="a plan nests sections a few levels deep: flatten it")
        return node


class _PlainValues:
    """Construction of plain data only: tags and oversized integers are refused, by line."""

    def construct_tagged(self, node: Any) -> Any:
        tag = str(node.tag)
        shown = "!!" + tag[len(YAML_TAG_PREFIX):] if tag.startswith(YAML_TAG_PREFIX) else tag
        mark = node.start_mark
        raise PlanTextError(
            "RL007", f"YAML tag `{shown}` is not allowed in a plan", mark.line, mark.column, len(shown),
            help="a plan holds plain values (mappings, lists, strings, numbers, booleans, null): remove the tag; "
                 "to reuse another file, use `base:`")

    def construct_yaml_int(self, node: Any) -> Any:
        try:
            return super().construct_yaml_int(node)  # type: ignore[misc]
        except ValueError:  # Python refuses int() of more than 4300 digits (sys.get_int_max_str_digits)
            mark = node.start_mark
            digits = sum(c.isdigit() for c in str(node.value))
            raise PlanTextError("RL008", f"integer of {digits:,} digits is longer than Python converts (the limit is "
                                "4300 digits)", mark.line, mark.column, len(str(node.value)),
                                help="no plan value needs more than 10 digits") from None


class PlanConstructor(_PlainValues, RoundTripConstructor):
    """A plan file: round-trip objects (they carry positions), plain values, no repeated keys."""

    def check_mapping_key(self, node: Any, key_node: Any, mapping: Any, key: Any, value: Any) -> bool:
        if key not in mapping:
            return True
        mark = key_node.start_mark
        width = max(key_node.end_mark.column - mark.column, 1) if key_node.end_mark.line == mark.line else 1
        first = mapping.lc.data.get(key) if mapping.lc.data else None
        related = (first[0], first[1], width, "first set here") if first else None
        where = f" on line {first[0] + 1}" if first else ""
        raise PlanTextError("RL002", f"duplicate key `{key}`: it is already set{where} of this mapping",
                            mark.line, mark.column, width, note="set again here", related=related,
                            help="keep one of the two: YAML does not merge repeated keys")


class ValueConstructor(_PlainValues, SafeConstructor):
    """An override's value (`key=[a, b]`): plain Python values."""


for _cls in (PlanConstructor, ValueConstructor):
    _cls.add_constructor(None, _cls.construct_tagged)
    _cls.add_constructor(YAML_TAG_PREFIX + "int", _cls.construct_yaml_int)


def _load(typ: str, constructor: type, text: str) -> Any:
    yaml = YAML(typ=typ, pure=True)
    yaml.Scanner = PLAN_SCANNER
    yaml.Composer = PlanComposer
    yaml.Constructor = constructor
    yaml.max_depth = MAX_DEPTH
    try:
        return yaml.load(text)
    except MaxDepthExceededError as exc:
        mark = exc.problem_mark
        raise PlanTextError("RL008", f"values nest more than {MAX_DEPTH} levels deep (the limit on nesting)",
                            mark.line, mark.column, help="a plan nests sections a few levels deep: flatten it") from None
    except RecursionError:  # a backstop: MAX_DEPTH stops nesting long before this
        raise PlanTextError("RL008", "values nest too deeply to be a plan", 0, 0) from None


def parse_plan_yaml(text: str, name: str) -> Any:
    """`text` as ruamel round-trip objects (None for an empty document); PlanInputError otherwise."""
    try:
        return _load("rt", PlanConstructor, text)
    except PlanTextError as exc:
        raise PlanInputError(_diagnostic(exc, name)) from exc
    except MarkedYAMLError as exc:
        raise PlanInputError(syntax_diagnostic(exc, name, text.splitlines())) from exc
    except ReaderError as exc:
        raise PlanInputError(_reader_diagnostic(exc, text, name)) from exc
    except YAMLError as exc:
        raise PlanInputError(error("RL002", "", f"YAML error in `{name}`: {exc}").at(Location(name))) from exc


def parse_value_yaml(text: str) -> Any:
    """An override's value as plain Python values, within the same limits as a plan file.
    Raises PlanTextError for a refusal or a limit, YAMLError for a syntax error."""
    return _load("safe", ValueConstructor, text)


def _location(name: str, line: int, col: int, width: int = 1) -> Location:
    return Location(name, line + 1, col + 1, col + 1 + width)


def _diagnostic(exc: PlanTextError, name: str) -> Diagnostic:
    diag = error(exc.code, "", exc.message, help=exc.help, note=exc.note).at(_location(name, exc.line, exc.col, exc.width))
    if exc.related:
        line, col, width, label = exc.related
        diag = diag.also(_location(name, line, col, width), label)
    return diag


# ruamel's "while ..." context -> what the person wrote; constructs that open with a bracket or a
# quote come first: where they begin is where the mistake usually is, not where the parser gave up.
OPENED = {
    "while parsing a flow sequence": ("the `[` list", "close the list with `]` and separate its items with `,`"),
    "while parsing a flow mapping": ("the `{` mapping", "close the mapping with `}` and separate its entries with `,`"),
    "while scanning a quoted scalar": ("the quoted string", "end the string with the quote it starts with"),
    "while scanning a simple key": ("the key", "write `key: value`, with a space after the colon"),
}
ENCLOSING = {
    "while parsing a block mapping": "the mapping",
    "while parsing a block collection": "the list",
    "while constructing a mapping": "the mapping",
    "while parsing a flow node": "the value",
    "while parsing a block node": "the value",
}


def syntax_diagnostic(exc: MarkedYAMLError, name: str, lines: list[str]) -> Diagnostic:
    """A YAML syntax error at both of ruamel's marks: where the construct began (context_mark) and
    where the parser gave up (problem_mark)."""
    problem = (exc.problem or "invalid YAML").strip()
    context = (exc.context or "").strip()
    begin, stop = _mark(exc.context_mark, lines), _mark(exc.problem_mark, lines)
    help = "fix the YAML at the marked position"
    if "'\\t'" in problem:
        help = "indent with spaces: YAML does not allow tabs there"
    elif "undefined alias" in problem:
        help = "an alias `*name` repeats a value anchored earlier in the file as `&name value`"
    if begin is None or stop is None or begin == stop:
        mark = stop or begin
        loc = _location(name, *mark) if mark else Location(name)
        shown = problem if begin is not None or not context or context.startswith("while scanning for") else f"{problem} ({context})"
        return error("RL002", "", f"YAML syntax error: {shown}", help=help).at(loc)
    at_end = "end of stream" in problem or "<stream end>" in problem
    gave_up = "the file ends here" if at_end else "the parser gave up here"
    where = "at the end of the file" if at_end else f"column {stop[1] + 1}" if stop[0] == begin[0] else f"line {stop[0] + 1}"
    if not context.startswith("while "):  # "expected a single document in the stream", "but found another document"
        if "single document" in context:
            return error("RL002", "", f"YAML syntax error: {context}, {problem}", note="a second document starts here",
                         help="a plan is one YAML document: remove the `---` line and merge what follows into the first").at(
                _location(name, *stop)).also(_location(name, *begin), "the first document starts here")
        return error("RL002", "", f"YAML syntax error: {context}, {problem} ({where})", help=help).at(_location(name, *stop))
    if context in OPENED:
        construct, help = OPENED[context]
        diag = error("RL002", "", f"YAML syntax error in {construct} that starts on line {begin[0] + 1}: {problem} ({where})",
                     help=help, note=f"{construct} starts here").at(_location(name, *begin))
        return diag if stop[0] == begin[0] else diag.also(_location(name, *stop), gave_up)
    construct = ENCLOSING.get(context, context.removeprefix("while "))
    diag = error("RL002", "", f"YAML syntax error: {problem} (in {construct} that starts on line {begin[0] + 1})",
                 help=help).at(_location(name, *stop))
    return diag if stop[0] == begin[0] else diag.also(_location(name, *begin), f"{construct} starts here")


def _mark(mark: Any, lines: list[str]) -> tuple[int, int] | None:
    """0-based (line, col) of a ruamel mark; past the last line (the end of the stream) it is the
    end of the last line, so that it can be shown."""
    if mark is None:
        return None
    if mark.line >= len(lines) and lines:
        return len(lines) - 1, len(lines[-1])
    return mark.line, mark.column


def _reader_diagnostic(exc: ReaderError, text: str, name: str) -> Diagnostic:
    if isinstance(exc.character, int) and isinstance(exc.position, int) and 0 <= exc.position <= len(text):
        line = text.count("\n", 0, exc.position)
        col = exc.position - (text.rfind("\n", 0, exc.position) + 1)
        return error("RL002", "", f"`{name}` contains the control character U+{exc.character:04X}, which YAML does not allow",
                     help="a plan is text: remove the character (tabs, newlines and printable characters are fine)").at(
            _location(name, line, col))
    return error("RL002", "", f"YAML error in `{name}`: {exc}").at(Location(name))
