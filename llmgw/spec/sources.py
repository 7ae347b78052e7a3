"""Where a model's weights come from: the ``source`` grammar.

Three kinds, told apart by their first characters:

* a **node path**: ``/models/llama-3.1-8b`` (or ``./x``, ``../x`` for the
  ``local`` node, made absolute when the cluster loads). Used as it is. It is
  written normalised (no ``.``, ``..`` or empty parts after a leading ``./`` or
  ``../``), so that :func:`within` can judge it by its text.
* an **URL** to a single file: ``https://host/path/model.gguf``, optionally
  ending in ``#sha256=<64 hex>`` so the agent can verify what it fetched.
* a **hub repo**: ``org/name[@revision][:selector]``. The revision is a
  branch, tag or commit (default ``main``). The selector picks files instead
  of the whole repository: comma-separated glob patterns
  (``:*Q4_K_M*.gguf,config.json``), or a bare quantisation tag in llama.cpp's
  style (``:Q4_K_M`` selects the ``.gguf`` files whose names contain it,
  case-insensitively), so a GGUF repo holding ten quantisations fetches one.

Everything is checked against strict patterns: cluster files come from pull
requests, and these strings end up in paths on nodes and in HTTP requests.

>>> parse("unsloth/gemma-3-270m-it-GGUF@main:Q4_K_M").patterns
('Q4_K_M',)

A purely computational module with no side effects.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

SourceKind = Literal["path", "url", "hub"]

# The hub's own rules for repo ids (huggingface_hub validate_repo_id): letters,
# digits, "-", "_", "."; no "--" or ".." (they would alias the cache's
# models--org--name directories); at most 96 characters per part.
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REPO = re.compile(rf"^(?P<org>{_PART})/(?P<name>{_PART})$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
_PATTERN = re.compile(r"^[A-Za-z0-9_.*?\[\]/-]{1,128}$")
_QUANT_TAG = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_URL_PATH = re.compile(r"^/[A-Za-z0-9._~%/+=-]*[A-Za-z0-9._~%+=-]$")
_HOST = re.compile(r"^[A-Za-z0-9.-]{1,253}(?::\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](?::\d{1,5})?$")
MAX_LENGTH = 512
MAX_PATTERNS = 16


class SourceError(ValueError):
    """A source string that is not a path, an URL or a hub repo; says which rule it broke."""


@dataclass(frozen=True)
class Source:
    """One parsed ``source``. ``text`` is the string as written."""

    kind: SourceKind
    text: str
    path: str | None = None
    url: str | None = None
    sha256: str | None = None
    repo: str | None = None
    revision: str = "main"
    patterns: tuple[str, ...] = ()

    @property
    def fetched(self) -> bool:
        """Whether the agent fetches it (a hub repo or an URL), rather than finding it."""
        return self.kind != "path"

    @property
    def pinned(self) -> bool:
        """Whether the revision names one commit (the bytes cannot change under it)."""
        return self.kind == "hub" and bool(_COMMIT.match(self.revision))

    @property
    def file_name(self) -> str:
        """The file an URL source names (its last path segment)."""
        return (urlsplit(self.url or "").path.rsplit("/", 1)[-1]) or "download"

    def selects(self, path: str) -> bool:
        """Whether a file of the repo (its path inside it) is part of this source."""
        if not self.patterns:
            return True
        for pattern in self.patterns:
            if _is_quant_tag(pattern):
                name = path.rsplit("/", 1)[-1]
                if name.lower().endswith(".gguf") and pattern.lower() in name.lower():
                    return True
            elif fnmatch.fnmatchcase(path, pattern):
                return True
        return False


def _is_quant_tag(pattern: str) -> bool:
    return bool(_QUANT_TAG.match(pattern)) and not any(c in pattern for c in "*?[.")


def is_path(text: str) -> bool:
    return text.startswith(("/", "./", "../"))


def parse(text: str) -> Source:
    """The :class:`Source` ``text`` describes; raises :class:`SourceError`."""
    if not text or len(text) > MAX_LENGTH:
        raise SourceError(f"a source is 1 to {MAX_LENGTH} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise SourceError(f"{text!r}: a source holds no control characters")
    if is_path(text):
        _check_path(text)
        return Source(kind="path", text=text, path=text)
    if any(ch.isspace() for ch in text):
        raise SourceError(f"{text!r}: a repo id or URL holds no spaces")
    if "://" in text:
        return _parse_url(text)
    return _parse_hub(text)


def _check_path(text: str) -> None:
    rest = text[1:] if text.startswith("/") else text.removeprefix("./")
    if not text.startswith("/"):
        while rest.startswith("../"):
            rest = rest[3:]
    if any(part in ("", ".", "..") for part in rest.split("/")):
        raise SourceError(f"{text!r}: a path source is written normalised: no '..', '.' or "
                          "empty parts (and no trailing /)")


def within(path: str, dirs: Iterable[str]) -> bool:
    """Whether ``path`` lies in one of ``dirs`` (or is one), judged by the text alone.

    Both are normalised first (``/models/`` is ``/models``); a relative path and an
    absolute one are never compared, since only the loader knows what ``./`` means.

    >>> within("/models/x.gguf", ["/models"]), within("/modelsx/y", ["/models"])
    (True, False)
    """
    wanted = posixpath.normpath(path)
    for directory in dirs:
        base = posixpath.normpath(directory)
        if base.startswith("/") != wanted.startswith("/"):
            continue
        if wanted == base or wanted.startswith(base.rstrip("/") + "/"):
            return True
    return False


def _parse_url(text: str) -> Source:
    parts = urlsplit(text)
    if parts.scheme not in ("https", "http"):
        raise SourceError(f"{text!r}: an URL source starts with https:// (or http:// on a "
                          "site's own network)")
    if parts.username or parts.password:
        raise SourceError(f"{text!r}: credentials do not belong in a source (it is in git); "
                          "use a token_file on the node")
    if not _HOST.match(parts.netloc):
        raise SourceError(f"{text!r}: {parts.netloc!r} is not a host name or address")
    if not _URL_PATH.match(parts.path or ""):
        raise SourceError(f"{text!r}: the URL must name a file (letters, digits, ._~%+=-/)")
    if parts.query:
        raise SourceError(f"{text!r}: no query string: signed URLs expire, and a source is kept "
                          "in git")
    sha256 = None
    if parts.fragment:
        key, _, value = parts.fragment.partition("=")
        if key != "sha256" or not _SHA256.match(value):
            raise SourceError(f"{text!r}: the only fragment is #sha256=<64 lowercase hex digits>")
        sha256 = value
    url = parts._replace(fragment="").geturl()
    return Source(kind="url", text=text, url=url, sha256=sha256)


def _parse_hub(text: str) -> Source:
    rest, _, selector = text.partition(":")
    repo, at, revision = rest.partition("@")
    if not _REPO.match(repo) or "--" in repo or ".." in repo:
        raise SourceError(
            f"{text!r} is not a path (starting with /, ./ or ../), an URL (https://…) or a hub "
            "repo `org/name[@revision][:files]` (letters, digits, . _ -; no -- or ..)"
        )
    if at and (not _REVISION.match(revision) or ".." in revision or revision.endswith("/")):
        raise SourceError(f"{text!r}: revision {revision!r} is not a branch, tag or commit")
    patterns: tuple[str, ...] = ()
    if selector or text.endswith(":"):
        patterns = tuple(selector.split(","))
        if len(patterns) > MAX_PATTERNS:
            raise SourceError(f"{text!r}: at most {MAX_PATTERNS} file patterns")
        for pattern in patterns:
            if not _PATTERN.match(pattern) or ".." in pattern or pattern.startswith("/"):
                raise SourceError(
                    f"{text!r}: file pattern {pattern!r} may hold letters, digits, . _ - / and "
                    "the globs * ? [ ]"
                )
    return Source(kind="hub", text=text, repo=repo, revision=revision or "main",
                  patterns=patterns)


def cache_folder(repo: str) -> str:
    """The hub cache's directory name for a model repo: ``models--org--name``."""
    return "models--" + repo.replace("/", "--")
