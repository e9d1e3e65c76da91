"""Bounding interpolation before anything is resolved.

OmegaConf resolves `${...}` lazily and caches nothing: in `x2: "${x1}${x1}"` each reference
resolves x1 again, so a chain of doublings (`x30: "${x29}${x29}"`, a kilobyte of YAML) takes
minutes and gigabytes, and `c: [${b}, ${b}]` doubles a whole mapping the same way. Here the
interpolation graph is walked once, each key memoized, with OmegaConf's own grammar parser,
to estimate what resolving every value would produce: the characters of each built string,
the keys and list items and characters of the whole config, its depth, and the references
followed. The estimates are upper bounds (a quote or an escape counts as a character), so a
config they pass resolves within the limits of torchloom.config.limits.

A key computed by an interpolation (`${models.${name}}`) is followed when `name` is a plain
value; computed by a resolver, it cannot be bounded before resolving and is refused.
Resolvers are bounded by what they read: `oc.env` by the variable, `oc.select` and
`oc.dict.*` by the key they name, `oc.create`/`oc.decode` by their argument; a resolver
registered from Python is code the user chose to run and is bounded by its arguments only.
"""

from __future__ import annotations

import os
import re
from typing import Any, NamedTuple

from omegaconf.errors import GrammarParseError
from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser as Grammar
from omegaconf.grammar_parser import parse
from omegaconf.vendor.antlr4.tree.Tree import TerminalNode

from torchloom.config.interpolation import ascii_digits, dotted
from torchloom.config.limits import (
    MAX_CHARS,
    MAX_DEPTH,
    MAX_INTERPOLATION_STEPS,
    MAX_STRING_LENGTH,
    MAX_VALUES,
    limit_problem,
)
from torchloom.errors import ConfigError, Problem, Where

Path = tuple[Any, ...]  # keys and list indices (ints), as in the plain config


class Size(NamedTuple):
    """What a value resolves to, at most. (A tuple: the walk makes one per value.)"""

    values: int = 0  # keys and list items inside it
    chars: int = 0  # characters of its keys and scalars
    depth: int = 0  # mappings and lists nested in it (a scalar is 0)
    steps: int = 0  # references resolved to build it
    length: int = 0  # characters when it is written into a string


def _text(length: int, steps: int = 0) -> Size:
    return Size(chars=length, steps=steps, length=length)


def _joined(parts: list[Size]) -> Size:
    """Parts written one after the other into a string."""
    return _text(sum(p.length for p in parts), sum(p.steps for p in parts))


def _container(items: list[tuple[int, Size]]) -> Size:
    """A mapping or list of (key characters, value) items."""
    chars = sum(key + value.chars for key, value in items)
    return Size(
        values=sum(1 + value.values for _, value in items),
        chars=chars,
        depth=1 + max((value.depth for _, value in items), default=0),
        steps=sum(value.steps for _, value in items),
        length=2 + sum(key + value.length + 4 for key, value in items),  # "{'k': v, ...}"
    )


class _Unbounded(Exception):
    """An interpolation whose target cannot be known before resolving."""


class _Estimator:
    def __init__(self, raw: dict[str, Any], where: Where) -> None:
        self.raw = raw
        self.where = where
        self.sizes: dict[Path, Size] = {}
        self.active: set[Path] = set()  # values being estimated, to stop at a cycle
        self.chain = 0  # references being followed, one inside the other

    # ---- the config's values ----------------------------------------------------------------
    def size_of(self, path: Path) -> Size:
        if path in self.sizes:
            return self.sizes[path]
        if path in self.active:  # a cycle: OmegaConf reports it with its own message
            return Size()
        self.active.add(path)
        try:
            size = self._measure(path, _value_at(self.raw, path))
        finally:
            self.active.discard(path)
        self._check(path, size)
        self.sizes[path] = size
        return size

    def _measure(self, path: Path, value: Any) -> Size:
        if isinstance(value, dict):
            return _container([(len(str(k)), self.size_of((*path, k))) for k in value])
        if isinstance(value, list):
            return _container([(0, self.size_of((*path, i))) for i in range(len(value))])
        if isinstance(value, str) and "${" in value:
            try:
                tree = parse(value)
            except GrammarParseError:  # reported with its line when OmegaConf meets it
                return _text(len(value))
            try:
                return self._visit(tree, path)
            except _Unbounded as exc:
                raise ConfigError.at(
                    self.where(*path),
                    f"key '{dotted(path)}'",
                    f"cannot bound '{value}' before resolving it: {exc}",
                    "name the key directly, or through a key set to a plain value",
                ) from None
        return _text(len(str(value)))

    def _check(self, path: Path, size: Size) -> None:
        checks = [
            (size.values > MAX_VALUES, "max_values", f"{MAX_VALUES:,} keys and list items"),
            (size.chars > MAX_CHARS, "max_chars", f"{MAX_CHARS:,} characters"),
            (len(path) + size.depth > MAX_DEPTH, "max_depth", f"{MAX_DEPTH} levels of nesting"),
            (
                size.steps > MAX_INTERPOLATION_STEPS,
                "max_interpolation_steps",
                f"{MAX_INTERPOLATION_STEPS:,} interpolation steps",
            ),
        ]
        for failed, name, amount in checks:
            if failed:
                found = f"{_name(path)} resolves to more than {amount}"
                raise ConfigError([self._problem(path, name, found)])

    def _problem(self, path: Path, name: str, found: str) -> Problem:
        return limit_problem(self.where(*path), name, found)

    # ---- one interpolation string, by its parse tree --------------------------------------
    def _visit(self, ctx: Any, at: Path) -> Size:
        if isinstance(ctx, TerminalNode):
            return _text(0 if _is_eof(ctx) else len(_leaf(ctx).getText()))
        if isinstance(ctx, Grammar.InterpolationNodeContext):
            return self._reference(ctx, at)
        if isinstance(ctx, Grammar.InterpolationResolverContext):
            return self._resolver(ctx, at)
        if isinstance(ctx, Grammar.ListContainerContext):
            return _container([(0, self._visit(e, at)) for e in _elements(ctx)])
        if isinstance(ctx, Grammar.DictContainerContext):
            pairs = [c for c in ctx.getChildren() if isinstance(c, Grammar.DictKeyValuePairContext)]
            # dictKeyValuePair: dictKey COLON element
            items = [(len(p.getChild(0).getText()), self._visit(p.getChild(2), at)) for p in pairs]
            return _container(items)
        children = [c for c in ctx.getChildren() if not _is_eof(c)]
        if len(children) == 1:  # `${a}` alone is a's value itself, a mapping stays a mapping
            return self._visit(children[0], at)
        size = _joined([self._visit(c, at) for c in children])
        if size.length > MAX_STRING_LENGTH:
            found = f"{_name(at)} builds a string of up to {size.length:,} characters"
            raise ConfigError([self._problem(at, "max_string_length", found)])
        return size

    def _reference(self, ctx: Any, at: Path) -> Size:
        key, steps = "", 0
        for child in ctx.getChildren():
            if isinstance(child, Grammar.ConfigKeyContext):
                inner = child.getChild(0)
                if isinstance(inner, Grammar.InterpolationContext):
                    text, inner_steps = self._static_text(inner, at)
                    key, steps = key + text, steps + inner_steps
                else:
                    key += re.sub(r"\\([\\.\[\]:=])", r"\1", child.getText())
            elif child.getText() in (".", "[", "]"):
                key += child.getText()
        size = self._follow(key, at)
        return Size(size.values, size.chars, size.depth, size.steps + steps + 1, size.length)

    def _follow(self, key: str, at: Path) -> Size:
        """The size of what `key` names from `at` (nothing, when it names nothing: OmegaConf
        then reports the missing key)."""
        target = self._target(key, at)
        if target is None:
            return Size()
        self.chain += 1
        try:
            if self.chain > MAX_DEPTH:  # OmegaConf recurses per link and fails at about 70
                found = f"{_name(at)} follows a chain of more than {MAX_DEPTH} interpolations"
                raise ConfigError([self._problem(at, "max_depth", found)])
            return self.size_of(target)
        finally:
            self.chain -= 1

    def _resolver(self, ctx: Any, at: Path) -> Size:
        name = ctx.getChild(1).getText()
        if "${" in name:
            raise _Unbounded("the resolver's name is computed by an interpolation")
        args = _elements(ctx)
        sizes = [self._visit(arg, at) for arg in args]
        steps = 1 + sum(s.steps for s in sizes)
        if name == "oc.env" and args:
            variable, _ = self._static_text(args[0], at)
            default_length = sizes[1].length if len(sizes) > 1 else 0
            return _text(max(len(os.environ.get(variable, "")), default_length), steps)
        if name in ("oc.select", "oc.deprecated", "oc.dict.keys", "oc.dict.values") and args:
            key, _ = self._static_text(args[0], at)
            size = self._follow(key, at)
            default = sizes[1] if len(sizes) > 1 else Size()
            big = size if size.values + size.length >= default.values + default.length else default
            return Size(big.values, big.chars, big.depth, steps + size.steps, big.length)
        if name == "oc.decode" and sizes:
            # Decoding a string makes at most one item per character, nested at most as deep
            # as its brackets (or characters, when the string is itself interpolated).
            text = args[0].getText()
            length = sizes[0].length
            depth = text.count("[") + text.count("{") if "${" not in text else length
            return Size(length, length, depth, steps, length)
        whole = _container([(0, s) for s in sizes]) if sizes else Size()
        if name == "oc.create" and sizes:
            whole = sizes[0]
        return Size(whole.values, whole.chars, whole.depth, steps, whole.length)

    def _static_text(self, ctx: Any, at: Path) -> tuple[str, int]:
        """The text a key-naming argument or key part stands for, known without resolving:
        plain text, or one reference to a plain value; and the steps it takes."""
        text = ctx.getText().strip("'\"")
        if "${" not in text:
            return text, 0
        if _find(ctx, Grammar.InterpolationResolverContext):
            raise _Unbounded("a key in it is computed by a resolver")
        nodes = _find(ctx, Grammar.InterpolationNodeContext)
        if len(nodes) != 1 or nodes[0].getText() != text or "${" in text[2:-1]:
            raise _Unbounded("a key in it is computed by more than one interpolation")
        target = self._target(text[2:-1], at)
        if target is None:
            return "", 1  # names nothing: OmegaConf reports the missing key
        value = _value_at(self.raw, target)
        if isinstance(value, dict | list) or (isinstance(value, str) and "${" in value):
            raise _Unbounded("a key in it is computed by another interpolation")
        return str(value), 1

    def _target(self, key: str, at: Path) -> Path | None:
        """The path `key` names from the value at `at`, or the nearest existing value that
        contains it (an upper bound); None when nothing it names exists."""
        dots = len(key) - len(key.lstrip("."))
        if dots > len(at):
            return None
        base: Path = at[: len(at) - dots] if dots else ()
        parts = re.findall(r"[^.\[\]]+", key[dots:])
        node: Any = _value_at(self.raw, base)
        path = base
        for part in parts:
            if isinstance(node, str) and "${" in node:
                return path  # inside a value that is itself interpolated: all of it
            keys = [k for k in node if str(k) == part] if isinstance(node, dict) else []
            if keys:
                key_: Any = keys[0]
            elif isinstance(node, list) and ascii_digits(part) and int(part) < len(node):
                key_ = int(part)
            else:
                return None
            node, path = node[key_], (*path, key_)
        return path


def _value_at(raw: Any, path: Path) -> Any:
    for key in path:
        raw = raw[key]
    return raw


def _elements(ctx: Any) -> list[Any]:
    """The elements of a sequence, or of the sequence inside a list."""
    found = []
    for child in ctx.getChildren():
        if isinstance(child, Grammar.ElementContext):
            found.append(child)
        elif isinstance(child, Grammar.SequenceContext):
            found += _elements(child)
    return found


def _find(ctx: Any, kind: type) -> list[Any]:
    if isinstance(ctx, kind):
        return [ctx]
    if isinstance(ctx, TerminalNode):
        return []
    return [found for child in ctx.getChildren() for found in _find(child, kind)]


def _leaf(ctx: TerminalNode) -> Any:
    return ctx  # the vendored antlr4 runtime declares no methods on TerminalNode


def _is_eof(ctx: Any) -> bool:
    return isinstance(ctx, TerminalNode) and _leaf(ctx).getSymbol().type < 0  # EOF is -1


def _name(path: Path) -> str:
    return f"'{dotted(path)}'" if path else "the config"


def check_interpolation_bounds(raw: dict[str, Any], where: Where) -> Size:
    """What resolving the unresolved plain config `raw` would produce, at most; a ConfigError
    naming the key and the limit when that passes a loading limit. `where(*path)` says where
    a key path was set."""
    return _Estimator(raw, where).size_of(())
