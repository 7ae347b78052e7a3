"""Load a cluster directory into a :class:`~llmgw.spec.models.Cluster`.

Every ``*.yaml`` below the directory is read with ruamel.yaml, which keeps the
line and column of every key and value. Sections are merged across files;
collections are maps keyed by name, so the same name in two places is an
error naming both. Then the merged data is validated twice: shape by pydantic
(:mod:`llmgw.spec.models`), meaning by :mod:`llmgw.spec.checks`. Every
problem found on the way is reported at once as ``path:line:col: message``.

Usage::

    try:
        cluster = loading.load("cluster/")
    except loading.SpecErrors as exc:
        print(exc)          # one located message per line

A :class:`Reader` loads the same directory again and again (the daemon, on each
edit) and parses only the files whose content changed: a 10,000-node cluster is
seconds of ruamel, and an edit of ``models.yaml`` should not pay them again.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import types
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic
from pydantic import BaseModel
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError, YAMLWarning

from llmgw.spec import bounds, checks, identifiers, partials, secrets, statedirs, upstreams
from llmgw.spec.models import SECTIONS, Cluster

DataPath = tuple[str | int, ...]
COLLECTIONS = ("fabrics", "nodes", "models", "projects", "engines", "upstreams")
_SINGULAR = {"fabrics": "fabric", "nodes": "node", "models": "model", "projects": "project",
             "engines": "engine", "upstreams": "upstream"}


@dataclass(frozen=True, order=True)
class Location:
    path: str
    line: int  # 1-based
    col: int  # 1-based

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}"


@dataclass(frozen=True)
class SpecError:
    location: Location | None
    message: str

    def __str__(self) -> str:
        # CI posts a failed plan's errors as the pull request comment: a value quoted back
        # (`unknown GPU class '…'`) is scrubbed like every other public text.
        message = secrets.scrub(self.message)
        return f"{self.location}: {message}" if self.location else message


class SpecErrors(Exception):
    """Everything wrong with a cluster directory, each problem with its place."""

    def __init__(self, errors: Iterable[SpecError]) -> None:
        self.errors = sorted(errors, key=_error_order)
        super().__init__("\n".join(str(e) for e in self.errors))


def _error_order(error: SpecError) -> tuple[Location, str]:
    return (error.location or Location("", 0, 0), error.message)


@dataclass
class Sources:
    """Where each piece of the merged data came from."""

    directory: Path
    keys: dict[DataPath, Location] = field(default_factory=dict)
    values: dict[DataPath, Location] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)

    def locate(self, path: DataPath, prefer_key: bool = False) -> Location | None:
        """The closest known place for ``path``, walking up to its parents."""
        order = (self.keys, self.values) if prefer_key else (self.values, self.keys)
        for end in range(len(path), -1, -1):
            for table in order:
                if path[:end] in table:
                    return table[path[:end]]
        return None


def yaml_files(directory: Path) -> list[Path]:
    """The cluster files: every ``*.yaml``/``*.yml`` directly in ``directory``, sorted.

    Subdirectories are not read: they hold other things (``cluster.example/local``
    is a cluster of its own, ``agent/`` holds an agent's config).
    """
    files = [*directory.glob("*.yaml"), *directory.glob("*.yml")]
    return sorted(p for p in files if p.is_file() and not p.name.startswith("."))


Checker = Callable[[Cluster], Iterable[checks.Problem]]


def load(directory: str | Path, extra_checks: Sequence[Checker] = ()) -> Cluster:
    """Load, merge and validate a cluster directory; raise :class:`SpecErrors`.

    ``extra_checks`` are meaning checks from layers above the spec (the engines'
    flag tables); their problems are located and reported with the others.
    """
    return load_with_sources(directory, extra_checks)[0]


def load_with_sources(
    directory: str | Path, extra_checks: Sequence[Checker] = ()
) -> tuple[Cluster, Sources]:
    return _load(directory, extra_checks, None)


class Reader:
    """:func:`load`, again and again: each file's parse is kept, keyed by its displayed
    path and a digest of its content, and a file is parsed again only when its content
    changed. Every file is still read, and the merge and both validations run on the
    whole directory, so the result (a cluster, or the same located errors) is what
    :func:`load` returns. Only the files of the last load are kept.

        reader = loading.Reader()
        cluster = reader.load("cluster/")   # every file parsed
        cluster = reader.load("cluster/")   # after an edit: only the edited file
    """

    def __init__(self) -> None:
        self._files: dict[tuple[str, bytes], _Parsed] = {}
        self.parsed = 0  # files the last load parsed (the others were unchanged)

    def load(self, directory: str | Path, extra_checks: Sequence[Checker] = ()) -> Cluster:
        return self.load_with_sources(directory, extra_checks)[0]

    def load_with_sources(
        self, directory: str | Path, extra_checks: Sequence[Checker] = ()
    ) -> tuple[Cluster, Sources]:
        cache = _Cache(self._files)
        try:
            return _load(directory, extra_checks, cache)
        finally:
            self._files, self.parsed = cache.used, cache.parsed


@dataclass
class _Cache:
    known: dict[tuple[str, bytes], _Parsed]
    used: dict[tuple[str, bytes], _Parsed] = field(default_factory=dict)
    parsed: int = 0


def _load(
    directory: str | Path, extra_checks: Sequence[Checker], cache: _Cache | None
) -> tuple[Cluster, Sources]:
    root = Path(directory)
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        raise SpecErrors([SpecError(None, f"{root}: cluster directory {what}")])
    sources = Sources(root)
    errors: list[SpecError] = []
    merged: dict[str, Any] = {}
    files = yaml_files(root)
    if not files:
        raise SpecErrors([SpecError(None, f"{root}: no *.yaml files in the cluster directory")])
    budget = _Budget()
    for path in files:
        display = _display(path)
        sources.files.append(path)
        items = _read(path, display, errors, budget, cache)
        if items is not None:
            _merge(items, merged, sources, errors)
    if "cluster" not in merged and not errors:
        errors.append(SpecError(
            Location(_display(files[0]), 1, 1),
            "no `cluster:` section in any file (it needs at least `name`)",
        ))
    cluster: Cluster | None = None
    if "cluster" in merged:
        try:
            cluster = Cluster.model_validate(merged)
        except pydantic.ValidationError as exc:
            shape = list(_shape_errors(exc, merged, sources))
            errors.extend(error for error, _ in shape)
            _check_partial(merged, {path for _, path in shape}, sources, errors)
    if cluster is not None:
        errors.extend(_meaning_errors(cluster, sources, extra_checks))
    if errors:
        raise SpecErrors(errors)
    assert cluster is not None
    resolved = _resolve_relative(cluster, root)
    errors = [SpecError(sources.locate(path), message)
              for path, message in upstreams.file_problems(resolved)]
    if errors:
        raise SpecErrors(errors)
    return resolved, sources


def _resolve_relative(cluster: Cluster, root: Path) -> Cluster:
    """Make ``./``/``../`` paths absolute against the cluster directory (the local node's)."""
    def resolve(text: str | None) -> str | None:
        if text is None or not checks.is_relative_path(text):
            return text
        return str((root / text).resolve())

    nodes = {
        name: node.model_copy(update={"weights_dirs": [resolve(p) for p in node.weights_dirs]})
        for name, node in cluster.nodes.items()
    }
    models = {
        name: model.model_copy(update={
            "source": resolve(model.source),
            "profiles": [p.model_copy(update={"source": resolve(p.source)})
                         for p in model.profiles],
            "adapters": [a.model_copy(update={"source": resolve(a.source)})
                         for a in model.adapters],
        })
        for name, model in cluster.models.items()
    }
    settings = cluster.cluster

    def anchored(text: str) -> str:
        return text if text.startswith("/") else str((root / text).resolve())

    state_dir = (anchored(str(Path(settings.state_dir).expanduser()))
                 if settings.state_dir else None)
    state = statedirs.of(settings.model_copy(update={"state_dir": state_dir}))
    settings = settings.model_copy(update={
        "ssh": settings.ssh.model_copy(update={"known_hosts": anchored(settings.ssh.known_hosts)}),
        "state_dir": state_dir,
        "store": settings.store.model_copy(update={
            "path": anchored(settings.store.path),
            "password_file": _secret_path(settings.store.password_file, root, state),
        }),
        "agent_socket": resolve(settings.agent_socket),
    })
    nodes = {
        name: node.model_copy(update={"agent_socket": resolve(node.agent_socket)})
        for name, node in nodes.items()
    }
    remotes = {
        name: upstream.model_copy(update={
            "api_key_file": _secret_path(upstream.api_key_file, root, state)})
        if upstream.api_key_file else upstream
        for name, upstream in cluster.upstreams.items()
    }
    return cluster.model_copy(update={"cluster": settings, "nodes": nodes, "models": models,
                                      "upstreams": remotes})


def _secret_path(text: str | None, root: Path, state: Path) -> str | None:
    """A secret file's absolute path: a relative one is in the state directory
    (:mod:`llmgw.spec.statedirs`), or, when only there, in the cluster directory, where
    older llmgw looked (``llmgw validate`` warns that it lies there)."""
    if text is None:
        return None
    path = Path(text).expanduser()
    if path.is_absolute():
        return str(path)
    old = (root / path).resolve()
    if not (state / path).exists() and old.exists():
        return str(old)
    return str(state / path)


def _meaning_errors(
    cluster: Cluster, sources: Sources, extra_checks: Sequence[Checker]
) -> list[SpecError]:
    found = [*checks.check(cluster)]
    for extra in extra_checks:
        found.extend(extra(cluster))
    return [SpecError(sources.locate(p.path, prefer_key=p.at_key), p.message) for p in found]


def _check_partial(
    merged: dict[str, Any], bad_paths: set[DataPath], sources: Sources,
    errors: list[SpecError],
) -> None:
    """Meaning checks on the parts whose shape is valid, so one run reports everything."""
    for problem in partials.problems(merged, bad_paths, _data_path):
        errors.append(SpecError(sources.locate(problem.path, prefer_key=problem.at_key),
                                problem.message))


def _display(path: Path) -> str:
    """Paths as the user would type them: relative to the working directory if below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# --- syntax ---------------------------------------------------------------

@dataclass
class _Budget:
    """What the directory's files may still hold (:mod:`llmgw.spec.bounds`)."""

    bytes: int = bounds.YAML_MAX_DIRECTORY_BYTES
    values: int = bounds.YAML_MAX_DIRECTORY_VALUES


@dataclass(frozen=True)
class _Entry:
    """One name of a collection (or one setting) in one file, as plain data."""

    name: str  # the key, as data
    shown: str  # the key, as messages quote it
    key: Location
    value: Location
    data: Any
    keys: dict[DataPath, Location]  # where each key and value below it is
    values: dict[DataPath, Location]


@dataclass(frozen=True)
class _Section:
    name: str
    key: Location
    entries: list[_Entry]


_Item = SpecError | _Section  # a file's problems of its own, and its sections, in order


@dataclass(frozen=True)
class _Parsed:
    """What a file's content parses to: all of it depends on the content and the
    displayed path alone, so it is kept across loads (:class:`Reader`)."""

    values: int  # what the file expands to (:func:`.bounds.check_yaml`)
    errors: list[SpecError]  # its syntax errors
    items: list[_Item] | None  # None: the file did not parse


def _read(
    path: Path, display: str, errors: list[SpecError], budget: _Budget, cache: _Cache | None
) -> list[_Item] | None:
    try:
        size = path.stat().st_size
        if size > budget.bytes:
            raise bounds.BoundError(1, 1, "the cluster directory's files hold more than "
                                    f"{bounds.YAML_MAX_DIRECTORY_BYTES // 1024 // 1024} MiB")
        text = bounds.read_text(path, bounds.YAML_MAX_BYTES)
        encoded = text.encode()
        budget.bytes -= len(encoded)
        key = (display, hashlib.sha256(encoded).digest())
        known = cache.known.get(key) if cache is not None else None
        # What check_yaml found fits in what the other files left: it would find the
        # same again (only a limit passed raises, and it passed none).
        if known is not None and known.values <= budget.values:
            values = known.values
        else:
            known = None
            values = bounds.check_yaml(text, budget.values)
        budget.values -= values
    except bounds.BoundError as exc:
        errors.append(SpecError(Location(display, exc.line, exc.col), exc.message))
        return None
    except (OSError, UnicodeDecodeError) as exc:
        errors.append(SpecError(Location(display, 1, 1), f"cannot read file: {exc}"))
        return None
    if known is None:
        found: list[SpecError] = []
        document = _parse(text, display, found)
        known = _Parsed(values, found, None if found else _items(document, display))
        if cache is not None:
            cache.parsed += 1
    if cache is not None:
        cache.used[key] = known
    errors.extend(known.errors)
    return known.items


def _parse(text: str, display: str, errors: list[SpecError]) -> Any:
    """The file's document; None, with its errors, when it has any (or is empty)."""
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", YAMLWarning)
        try:
            document = yaml.load(text)
        except MarkedYAMLError as exc:
            errors.append(_syntax_error(exc, display, text))
            return None
        except YAMLError as exc:
            errors.append(SpecError(Location(display, 1, 1), f"invalid YAML: {exc}"))
            return None
        except (AttributeError, TypeError, RecursionError) as exc:
            # ruamel crashes on some self-referencing merges (`a: &x {<<: *x}`)
            # instead of raising a YAMLError; it is still the file's fault.
            errors.append(SpecError(Location(display, 1, 1), "invalid YAML: the parser "
                                    f"failed ({exc}); check for an alias (*name) used inside "
                                    "the anchor (&name) it refers to"))
            return None
    found = [w for w in caught if issubclass(w.category, YAMLWarning)]
    for warning in found:
        errors.append(_warning_error(str(warning.message), display))
    return None if found else document


def _warning_error(text: str, display: str) -> SpecError:
    """ruamel warns (rather than fails) on a reused anchor; in a cluster file it is a slip."""
    places = re.findall(r"line (\d+), column (\d+)", text)
    line, col = (int(places[-1][0]), int(places[-1][1])) if places else (1, 1)
    anchor = re.search(r"duplicate anchor '([^']+)'", text)
    if anchor:
        first = f" (first defined at line {places[0][0]})" if len(places) > 1 else ""
        return SpecError(Location(display, line, col),
                         f"anchor '&{anchor.group(1)}' defined twice{first}")
    return SpecError(Location(display, line, col), f"invalid YAML: {text.strip()}")


def _syntax_error(exc: MarkedYAMLError, display: str, text: str) -> SpecError:
    mark = exc.problem_mark or exc.context_mark
    line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    problem = (exc.problem or "").strip()
    context = (exc.context or "").strip()
    lines = text.splitlines()
    offending = lines[line - 1] if 0 < line <= len(lines) else ""
    indent = offending[: len(offending) - len(offending.lstrip())]
    if "'\\t'" in problem or "\t" in problem or "\t" in indent:
        tab_col = offending.index("\t") + 1 if "\t" in offending else col
        return SpecError(
            Location(display, line, tab_col),
            "tab character in indentation: YAML indents with spaces only",
        )
    if "duplicate key" in problem or "found duplicate key" in context:
        first = exc.context_mark
        key = problem.split('"')[1] if problem.count('"') >= 2 else ""
        where = f" (first defined at line {first.line + 1})" if first else ""
        return SpecError(Location(display, line, col), f"duplicate key '{key}'{where}")
    if "quoted scalar" in context:
        start = exc.context_mark
        if start is not None:
            line, col = start.line + 1, start.column + 1
        return SpecError(Location(display, line, col), "unclosed quote: the string starting "
                         "here has no closing quote")
    if "expected <block end>" in problem:
        return SpecError(Location(display, line, col), "bad indentation: this line does not "
                         "line up with the keys above it")
    if "mapping values are not allowed" in problem:
        return SpecError(Location(display, line, col), "bad indentation or a missing space "
                         "after ':' (a value cannot hold another `key: value` on one line)")
    message = f"{context}: {problem}" if context and problem else (problem or context)
    return SpecError(Location(display, line, col), f"invalid YAML: {message}")


# --- merging --------------------------------------------------------------

def _items(document: Any, display: str) -> list[_Item]:
    """A file's sections as plain data with their places, and its problems of its own."""
    if document is None:
        return []  # an empty file (or only comments) is fine
    if not isinstance(document, CommentedMap):
        return [SpecError(
            Location(display, 1, 1),
            "a cluster file must be a mapping of sections: " + ", ".join(SECTIONS),
        )]
    items: list[_Item] = []
    for section, body in document.items():
        key_loc = _key_location(document, section, display)
        value_loc = _value_location(document, section, display) or key_loc
        if section not in SECTIONS:
            items.append(SpecError(key_loc, f"unknown section '{section}'"
                                   + _did_you_mean(str(section), SECTIONS)))
            continue
        if body is None:
            continue
        if not isinstance(body, CommentedMap):
            noun = "settings" if section == "cluster" else f"name → {_SINGULAR[section]}"
            items.append(SpecError(value_loc, f"section '{section}' must be a mapping of {noun}"))
            continue
        entries = []
        for name, value in body.items():
            key = _plain_key(name)
            here = _key_location(body, name, display)
            below = Sources(Path())
            data = _plain(value, (section, key), display, below)
            entries.append(_Entry(key, f"{name}", here,
                                  _value_location(body, name, display) or here,
                                  data, below.keys, below.values))
        items.append(_Section(section, key_loc, entries))
    return items


def _merge(
    items: list[_Item], merged: dict[str, Any], sources: Sources, errors: list[SpecError],
) -> None:
    for item in items:
        if isinstance(item, SpecError):
            errors.append(item)
            continue
        section = item.name
        target = merged.setdefault(section, {})
        sources.keys.setdefault((section,), item.key)
        for entry in item.entries:
            path: DataPath = (section, entry.name)
            if entry.name in target:
                first = sources.keys.get(path)
                noun = f"{_SINGULAR[section]} '{entry.shown}'" if section in COLLECTIONS else (
                    f"setting 'cluster.{entry.shown}'")
                errors.append(SpecError(entry.key, f"duplicate {noun}: also defined at {first}"))
                continue
            sources.keys[path] = entry.key
            sources.values[path] = entry.value
            sources.keys.update(entry.keys)
            sources.values.update(entry.values)
            target[entry.name] = entry.data


def _plain_key(key: Any) -> str:
    return str(key) if not isinstance(key, str) else key


def _plain(node: Any, path: DataPath, display: str, sources: Sources) -> Any:
    """ruamel's round-trip nodes → plain Python, recording each position."""
    if isinstance(node, CommentedMap):
        out: dict[str, Any] = {}
        for key, value in node.items():
            child = (*path, _plain_key(key))
            key_loc = _key_location(node, key, display)
            if key_loc:
                sources.keys[child] = key_loc
            value_loc = _value_location(node, key, display)
            if value_loc:
                sources.values[child] = value_loc
            out[_plain_key(key)] = _plain(value, child, display, sources)
        return out
    if isinstance(node, CommentedSeq):
        items = []
        for index, value in enumerate(node):
            child = (*path, index)
            try:
                line, col = node.lc.item(index)
                sources.values[child] = Location(display, line + 1, col + 1)
            except (KeyError, AttributeError, TypeError):
                pass
            items.append(_plain(value, child, display, sources))
        return items
    if isinstance(node, bool):
        return bool(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node


def _key_location(node: CommentedMap, key: Any, display: str) -> Location:
    try:
        line, col = node.lc.key(key)
        return Location(display, line + 1, col + 1)
    except (KeyError, AttributeError, TypeError):
        return Location(display, node.lc.line + 1, node.lc.col + 1)


def _value_location(node: CommentedMap, key: Any, display: str) -> Location | None:
    try:
        line, col = node.lc.value(key)
        return Location(display, line + 1, col + 1)
    except (KeyError, AttributeError, TypeError):
        return None


# --- shape (pydantic) -----------------------------------------------------

def _shape_errors(
    exc: pydantic.ValidationError, data: dict[str, Any], sources: Sources
) -> Iterator[tuple[SpecError, DataPath]]:
    seen: set[tuple[DataPath, str]] = set()
    for item in exc.errors(include_url=False):
        path = _data_path(item["loc"], data)
        message = _shape_message(item, path)
        if message is None or (path, message) in seen:
            continue
        seen.add((path, message))
        at_key = item["type"] in ("extra_forbidden", "missing") or "[key]" in item["loc"]
        yield SpecError(sources.locate(path, prefer_key=at_key), message), path


def _data_path(loc: tuple[int | str, ...], data: Any) -> DataPath:
    """pydantic's loc with union-branch tags dropped: only steps that exist in the data.

    A missing key is the last step and does not exist; keep it so the message can name it.
    """
    path: list[str | int] = []
    node = data
    for step in loc:
        if isinstance(node, dict) and step in node:
            node = node[step]
            path.append(step)
        elif isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
            node = node[step]
            path.append(step)
        elif step == "[key]":
            break  # the error is about the key itself, already the last step
        elif isinstance(node, dict) and isinstance(step, str) and step == loc[-1]:
            path.append(step)  # the missing key itself
            break
    return tuple(path)


_PLAIN_STEP = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/@+:-]*$")


def dotted(path: DataPath) -> str:
    """``models.m.profiles[0].args.max-model-len``; a key no pattern allows is shown quoted,
    so a newline in a hostile key never breaks an error line."""
    out = ""
    for step in path:
        if isinstance(step, int):
            out += f"[{step}]"
        elif not _PLAIN_STEP.match(step):
            out += f"[{identifiers.show(step)}]"
        else:
            out += f".{step}" if out else step
    return out


def _shape_message(item: Any, path: DataPath) -> str | None:
    kind = item["type"]
    where = dotted(path)
    given = item.get("input")
    if kind == "extra_forbidden":
        parent, key = path[:-1], str(path[-1])
        return f"{dotted(parent)}: unknown key '{key}'" + _did_you_mean(key, fields_at(parent))
    if kind == "missing":
        return f"{dotted(path[:-1]) or 'file'}: missing required key '{path[-1]}'"
    message = str(item["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    message = message[:1].lower() + message[1:]
    if kind.startswith(("int_", "float_", "bool_", "string_type", "dict_type", "list_type",
                        "literal_error", "enum", "model_type", "string_pattern",
                        "greater_than", "less_than")):
        message = f"{message}; got {_show(given)}"
    if kind == "too_short":
        message = "must not be empty"
    if kind == "string_pattern_mismatch":
        known = identifiers.describe(str((item.get("ctx") or {}).get("pattern", "")))
        noun, rule = known or ("name", "the documented pattern")
        noun = {"served_name": "served name", "label_key": "label key",
                "variable": "variable name", "model_pattern": "model name or glob"}.get(
                    noun, noun)
        message = f"invalid {noun} {_show(given)}: use {rule}"
    return f"{where}: {message}" if where else message


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return identifiers.show(value)


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    options = sorted(set(choices))
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    if options and len(options) <= 12:
        return f" (known keys: {', '.join(options)})"
    return ""


def fields_at(path: DataPath) -> list[str]:
    """The keys a mapping at ``path`` may hold, for did-you-mean hints."""
    model = _model_at(Cluster, path)
    if model is None:
        return []
    names = []
    for name, info in model.model_fields.items():
        names.append(info.alias or name)
    return names


def _model_at(model: type[BaseModel], path: DataPath) -> type[BaseModel] | None:
    current: Any = model
    for step in path:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            info = current.model_fields.get(str(step)) or next(
                (f for f in current.model_fields.values() if f.alias == step), None
            )
            if info is None:
                return None
            current = info.annotation
            continue
        origin = typing.get_origin(current)
        args = typing.get_args(current)
        if origin is dict and args:
            current = args[1]
        elif origin is list and args:
            current = args[0]
        else:
            return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Optional[X] / Annotated[X, ...] / X | list[X] → the first model-bearing X."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
            continue
        if origin in (typing.Union, types.UnionType):
            options = [a for a in typing.get_args(annotation) if a is not type(None)]
            models = [a for a in options if isinstance(a, type) and issubclass(a, BaseModel)]
            annotation = models[0] if models else options[0]
            continue
        return annotation
