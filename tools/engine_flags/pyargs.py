"""Argparse options of vLLM and SGLang, read from their source with ``ast``.

Nothing is imported or executed: an engine's wheel needs torch and a GPU to
import, and its command line is fully declared in source. Three ways of
declaring an option are understood:

* ``parser.add_argument("--name", "-n", action=..., choices=..., nargs=...)``;
* vLLM's ``group.add_argument("--name", **get_kwargs(SomeConfig)["field"])``,
  where the field's type annotation decides the argparse kwargs
  (``vllm/engine/arg_utils.py: _compute_kwargs``): ``bool`` becomes
  ``BooleanOptionalAction`` (``--x``/``--no-x``), ``Literal`` becomes
  ``choices`` (unless ``str`` is also allowed), ``bool | str | None`` takes an
  optional value, anything else takes a value; and every field of
  ``FrontendArgs`` becomes ``--field-name`` the same way;
* SGLang's ``field: A[T, "help"]`` / ``A[T, Arg(...)]`` namespace fields
  (``sglang/srt/arg_groups/arg_utils.py: add_cli_args_from_dataclass``):
  ``bool`` is ``store_true``, ``Literal``/``choices`` give choices, lists take
  one or more values.

The result is ``{option: {"value": "none"|"required"|"optional",
"choices": [...]?, "negation": "--no-x"?, "canonical": "--x"?}}`` where
``canonical`` marks an alias (``-tp`` → ``--tensor-parallel-size``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

Option = dict[str, Any]
_NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version"}
_BUILTINS = {"bool", "str", "int", "float", "dict", "list", "tuple", "set", "Any", "bytes"}


@dataclass
class Index:
    """Module-level classes and type aliases of a package, by name."""

    classes: dict[str, list[ast.ClassDef]] = field(default_factory=dict)
    aliases: dict[str, ast.expr] = field(default_factory=dict)
    trees: dict[str, ast.Module] = field(default_factory=dict)

    @classmethod
    def build(cls, sources: Iterable[tuple[str, str]]) -> Index:
        index = cls()
        for path, text in sources:
            try:
                tree = ast.parse(text, filename=path)
            except SyntaxError:
                continue
            index.trees[path] = tree
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    index.classes.setdefault(node.name, []).append(node)
                elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target = node.targets[0]
                    if isinstance(target, ast.Name) and _looks_like_type(node.value):
                        index.aliases.setdefault(target.id, node.value)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    if node.value is not None and _dotted(node.annotation).endswith("TypeAlias"):
                        index.aliases.setdefault(node.target.id, node.value)
                elif type(node).__name__ == "TypeAlias":
                    index.aliases.setdefault(node.name.id, node.value)  # type: ignore[attr-defined]
        return index

    def fields(self, name: str, seen: frozenset[str] = frozenset()) -> dict[str, ast.expr]:
        """Annotated fields of a class and its bases found in the index, bases first."""
        out: dict[str, ast.expr] = {}
        if name in seen:
            return out
        for klass in self.classes.get(name, [])[:1]:
            for base in klass.bases:
                out.update(self.fields(_dotted(base).split(".")[-1], seen | {name}))
            for node in klass.body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    text = _dotted(node.annotation)
                    if text.startswith(("ClassVar", "InitVar")) or node.target.id.startswith("_"):
                        out.pop(node.target.id, None)
                        continue
                    out[node.target.id] = node.annotation
        return out

    def is_dataclass(self, name: str) -> bool:
        for klass in self.classes.get(name, [])[:1]:
            decorators = {_dotted(d.func if isinstance(d, ast.Call) else d).split(".")[-1]
                          for d in klass.decorator_list}
            if decorators & {"dataclass", "config"}:
                return True
            bases = {_dotted(b).split(".")[-1] for b in klass.bases}
            if bases & {"BaseModel"}:
                return True
        return False

    def is_dict(self, name: str) -> bool:
        return any(_dotted(b).split(".")[-1] in {"dict", "TypedDict", "Dict"}
                   for klass in self.classes.get(name, [])[:1] for b in klass.bases)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Subscript):
        return _dotted(node.value)
    return ""


def _looks_like_type(node: ast.expr) -> bool:
    if isinstance(node, ast.Subscript):
        return _dotted(node.value).split(".")[-1] in {"Literal", "Union", "Optional", "Annotated"}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return True
    return False


# -- type hints, the way vLLM's get_type_hints/_compute_kwargs see them ---------

Hint = tuple[str, tuple[Any, ...]]  # ("bool", ()), ("literal", values), ("dataclass", ())


def hints(index: Index, node: ast.expr | None, depth: int = 0) -> set[Hint]:
    if node is None or depth > 12:
        return {("other", ())}
    if isinstance(node, ast.Constant):
        if node.value is None:
            return {("none", ())}
        if isinstance(node.value, str):  # a forward reference
            try:
                return hints(index, ast.parse(node.value, mode="eval").body, depth + 1)
            except SyntaxError:
                return {("other", ())}
        return {("other", ())}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return hints(index, node.left, depth + 1) | hints(index, node.right, depth + 1)
    if isinstance(node, ast.Subscript):
        head = _dotted(node.value).split(".")[-1]
        elts = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Optional":
            return hints(index, elts[0], depth + 1) | {("none", ())}
        if head == "Union":
            return set().union(*(hints(index, e, depth + 1) for e in elts))
        if head in {"Annotated", "A", "SkipValidation"}:
            return hints(index, elts[0], depth + 1)
        if head == "Literal":
            return {("literal", tuple(_literal_values(index, elts, depth)))}
        if head in {"list", "List", "Sequence"}:
            return {("list", ())}
        if head in {"tuple", "Tuple"}:
            return {("tuple", ())}
        if head in {"set", "Set"}:
            return {("set", ())}
        if head in {"dict", "Dict", "Mapping"}:
            return {("dict", ())}
        return {("other", ())}
    name = _dotted(node).split(".")[-1]
    if name in _BUILTINS:
        return {(name, ())}
    if name in index.aliases:
        return hints(index, index.aliases[name], depth + 1)
    if index.is_dataclass(name):
        return {("dataclass", ())}
    if index.is_dict(name):
        return {("dict", ())}
    return {("other", ())}


def _literal_values(index: Index, elts: list[ast.expr], depth: int) -> list[Any]:
    values: list[Any] = []
    for elt in elts:
        if isinstance(elt, ast.Constant):
            values.append(elt.value)
        else:
            for kind, inner in hints(index, elt, depth + 1):
                if kind == "literal":
                    values.extend(inner)
    return values


def from_hints(found: set[Hint]) -> Option:
    """argparse behaviour of a vLLM config field with these hints (_compute_kwargs)."""
    kinds = {kind for kind, _ in found}
    if "dataclass" in kinds:
        return {"value": "required"}
    if kinds == {"bool", "str", "none"}:
        return {"value": "optional"}
    if "bool" in kinds:
        return {"value": "none", "boolean": True}
    if "literal" in kinds:
        values = sorted({v for kind, vals in found if kind == "literal" for v in vals
                         if v is not None}, key=str)
        if "str" in kinds or not values:
            return {"value": "required"}
        return {"value": "required", "choices": [str(v) for v in values]}
    return {"value": "required"}


# -- add_argument calls ----------------------------------------------------------


def _const_list(index: Index, node: ast.expr, scope: dict[str, ast.expr]) -> list[str] | None:
    """Choices written as a literal list/tuple/set, or a name bound to one."""
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        out: list[str] = []
        for elt in node.elts:
            if isinstance(elt, ast.Constant) and elt.value is not None:
                out.append(str(elt.value))
            else:
                return None
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left = _const_list(index, node.left, scope)
        right = _const_list(index, node.right, scope)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Call) and _dotted(node.func) in {"list", "sorted", "set", "tuple"}:
        return _const_list(index, node.args[0], scope) if node.args else None
    if isinstance(node, ast.Name):
        bound = scope.get(node.id)
        if bound is not None and bound is not node:
            return _const_list(index, bound, {k: v for k, v in scope.items() if k != node.id})
    return None


def _kwargs_option(index: Index, call: ast.Call, scope: dict[str, ast.expr]) -> Option:
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    action = keywords.get("action")
    action_name = ""
    if isinstance(action, ast.Constant) and isinstance(action.value, str):
        action_name = action.value
    elif action is not None:
        action_name = _dotted(action).split(".")[-1]
    nargs = keywords.get("nargs")
    option: Option = {"value": "required"}
    if action_name in _NO_VALUE_ACTIONS or action_name.endswith(("StoreTrueAction",
                                                                   "StoreFalseAction")):
        option = {"value": "none"}
    elif action_name == "BooleanOptionalAction":
        option = {"value": "none", "boolean": True}
    elif isinstance(nargs, ast.Constant) and nargs.value in {"?", "*"}:
        option = {"value": "optional"}
    if "choices" in keywords and option["value"] != "none":
        choices = _const_list(index, keywords["choices"], scope)
        if choices is not None:
            option["choices"] = choices
    return option


def _scope(tree: ast.AST) -> dict[str, ast.expr]:
    """Simple ``name = value`` bindings visible in a function or module (last one wins)."""
    out: dict[str, ast.expr] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
    return out


def _kwargs_class(value: ast.expr) -> tuple[str, str | None] | None:
    """``get_kwargs(Cls)`` → (Cls, None); ``get_kwargs(Cls)["f"]`` → (Cls, "f")."""
    if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant):
        inner = _kwargs_class(value.value)
        if inner is not None:
            return inner[0], str(value.slice.value)
    if isinstance(value, ast.Call) and _dotted(value.func).endswith("get_kwargs") and value.args:
        return _dotted(value.args[0]).split(".")[-1], None
    return None


def add_argument_options(index: Index, paths: Iterable[str]) -> Iterator[tuple[list[str], Option]]:
    """Every ``add_argument`` call with dashed names in these modules."""
    module_scope: dict[str, ast.expr] = {}
    for path in paths:
        if path in index.trees:
            module_scope.update(_scope(index.trees[path]))
    for path in paths:
        tree = index.trees.get(path)
        if tree is None:
            continue
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            scope = {**module_scope, **_scope(func)}
            for call in ast.walk(func):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "add_argument"):
                    continue
                names = [a.value for a in call.args
                         if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                names = [n for n in names if n.startswith("-")]
                if not names:
                    continue
                spread = next((k.value for k in call.keywords if k.arg is None), None)
                option = _kwargs_option(index, call, scope)
                if spread is not None:
                    option = _spread_option(index, spread, scope) or option
                    explicit = _kwargs_option(index, call, scope)
                    if any(k.arg == "action" for k in call.keywords):
                        option = explicit
                yield names, option


def _spread_option(index: Index, spread: ast.expr, scope: dict[str, ast.expr]) -> Option | None:
    """``**model_kwargs["runner"]``: the option the config field's annotation makes."""
    if isinstance(spread, ast.Dict):  # **{**kwargs["x"], "default": None}
        inner = next((v for k, v in zip(spread.keys, spread.values, strict=True) if k is None),
                     None)
        found = _spread_option(index, inner, scope) if inner is not None else None
        overrides = [ast.keyword(arg=k.value, value=v)
                     for k, v in zip(spread.keys, spread.values, strict=True)
                     if isinstance(k, ast.Constant) and k.value in {"action", "nargs"}]
        if overrides:
            return _kwargs_option(index, ast.Call(func=spread, args=[], keywords=overrides),
                                  scope)
        return found
    if not (isinstance(spread, ast.Subscript) and isinstance(spread.slice, ast.Constant)):
        found = _kwargs_class(spread) if isinstance(spread, ast.Subscript) else None
        if isinstance(spread, ast.Name) and spread.id in scope:
            found = _kwargs_class(scope[spread.id])
        if found is None or found[1] is None:
            return None
        return from_hints(hints(index, index.fields(found[0]).get(found[1])))
    field_name = str(spread.slice.value)
    base = spread.value
    owner = _kwargs_class(base)
    if owner is None and isinstance(base, ast.Name) and base.id in scope:
        owner = _kwargs_class(scope[base.id])
    if owner is None:
        return None
    cls_name = owner[0]
    if owner[1] is not None:  # get_kwargs(VllmConfig)["logging_config"]["x"]: a nested config
        annotation = index.fields(cls_name).get(owner[1])
        cls_name = _dotted(annotation).split(".")[-1] if annotation is not None else ""
    return from_hints(hints(index, index.fields(cls_name).get(field_name)))


def dataclass_options(index: Index, cls_name: str) -> Iterator[tuple[list[str], Option]]:
    """Every field of a vLLM frontend dataclass as ``--field-name``."""
    for name, annotation in index.fields(cls_name).items():
        yield [f"--{name.replace('_', '-')}"], from_hints(hints(index, annotation))


def annotated_field_options(
    index: Index, paths: Iterable[str]
) -> Iterator[tuple[list[str], Option]]:
    """SGLang's ``field: A[T, "help" | Arg(...)]`` namespace fields."""
    for path in paths:
        tree = index.trees.get(path)
        if tree is None:
            continue
        for klass in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for node in klass.body:
                if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                    continue
                found = _sglang_field(index, node.target.id, node.annotation)
                if found is not None:
                    yield found


def _sglang_field(index: Index, name: str, annotation: ast.expr) -> tuple[list[str], Option] | None:
    if not (isinstance(annotation, ast.Subscript)
            and _dotted(annotation.value).split(".")[-1] in {"A", "Annotated"}
            and isinstance(annotation.slice, ast.Tuple)):
        return None
    inner, *meta = annotation.slice.elts
    arg: dict[str, ast.expr] | None = None
    for item in meta:
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            arg = {}
            break
        if isinstance(item, ast.Call) and _dotted(item.func).split(".")[-1] == "Arg":
            arg = {k.arg: k.value for k in item.keywords if k.arg}
            break
    if arg is None:
        return None
    if isinstance(arg.get("no_cli"), ast.Constant) and arg["no_cli"].value is True:  # type: ignore[union-attr]
        return None
    cli_name = arg.get("cli_name")
    names = [cli_name.value if isinstance(cli_name, ast.Constant) else
             "--" + name.replace("_", "-")]
    aliases = arg.get("aliases")
    if isinstance(aliases, (ast.List, ast.Tuple)):
        names += [a.value for a in aliases.elts if isinstance(a, ast.Constant)]
    found = {h for h in hints(index, inner) if h[0] != "none"}
    kinds = {kind for kind, _ in found}
    option: Option
    if "action" in arg:
        action = arg["action"]
        label = action.value if isinstance(action, ast.Constant) else _dotted(action)
        label = str(label).split(".")[-1]
        if label in _NO_VALUE_ACTIONS or label.endswith(("StoreTrueAction", "StoreFalseAction")):
            option = {"value": "none"}
        elif label == "BooleanOptionalAction":
            option = {"value": "none", "boolean": True}
        else:
            option = {"value": "required"}
    elif kinds == {"literal"}:
        values = arg.get("choices")
        choices = _const_list(index, values, {}) if values is not None else None
        option = {"value": "required", "choices": choices if choices is not None else
                  [str(v) for _, vals in found for v in vals if v is not None]}
    elif kinds == {"bool"}:
        option = {"value": "none"}
    else:
        option = {"value": "required"}
        nargs = arg.get("nargs")
        if isinstance(nargs, ast.Constant) and nargs.value in {"?", "*"}:
            option = {"value": "optional"}
        if "choices" in arg:
            choices = _const_list(index, arg["choices"], {})
            if choices is not None:
                option["choices"] = choices
    return [str(n) for n in names], option


def table(declared: Iterable[tuple[list[str], Option]]) -> dict[str, Option]:
    """Options by every name; aliases point at their canonical (first) name."""
    out: dict[str, Option] = {}
    for names, option in declared:
        canonical = names[0]
        if canonical in out:
            continue  # the first registration wins, as in argparse conflicts
        entry = dict(option)
        boolean = entry.pop("boolean", False)
        if boolean:
            entry["negation"] = "--no-" + canonical.lstrip("-")
        out[canonical] = entry
        for alias in names[1:]:
            out.setdefault(alias, {**entry, "canonical": canonical})
        if boolean:
            out.setdefault(entry["negation"], {"value": "none", "canonical": canonical})
    return dict(sorted(out.items()))
