"""What a secret looks like: the one place that finds credentials in text and hides them.

Plans quote what nodes say (an engine's error lines, a unit's detail, the
program holding a port) and pull request comments quote plans, so every
free text that leaves llmgw for a public place goes through :func:`scrub`:
the plan formats (:mod:`llmgw.planning.outputs`), the fleet snapshot of the
admin API (:mod:`llmgw.fleet.redactions`). ``llmgw validate`` asks
:func:`shape` of each value in a profile's ``args`` and ``env`` and
:func:`secret_flag` of each flag (:mod:`llmgw.spec.checks`).

The shapes, each with its rule (``docs/security.md``, "What a public plan may
contain"):

* **Hugging Face token** — ``hf_`` and 30 or more letters and digits.
* **OpenAI-style key** — ``sk-`` (``sk-proj-``, ``sk-ant-``…) and 20 or more
  letters, digits, ``-`` and ``_`` mixing upper case, lower case and digits.
* **GitHub token** — ``ghp_``, ``gho_``, ``ghu_``, ``ghs_``, ``ghr_`` and 36 or
  more letters and digits; ``github_pat_`` and 22 or more.
* **AWS access key id** — ``AKIA``/``ASIA`` and 16 upper-case letters and digits.
* **JSON Web Token** — three dot-separated base64url parts, the first two
  starting ``eyJ`` (``{"`` encoded).
* **Authorization header** — ``Bearer``/``Basic``/``Token`` and a credential of
  8 or more characters, ``Authorization:`` and whatever follows.
* **password in a URL** — ``scheme://user:password@``.
* **private key** — a PEM ``-----BEGIN … PRIVATE KEY-----`` line.
* **long random string** — 20 or more characters of ``[A-Za-z0-9+=]`` between
  any others, mixing upper case, lower case and at least two digits, with a
  Shannon entropy of at least 3.5 bits per character (4.0 from 32 on).
  Words joined by ``-``, ``_``, ``.`` or ``/`` never count, so model names,
  repo ids and paths pass; hex digests (no upper case) pass.

:func:`scrub` also hides the value of ``key=value``, ``key: value`` and
``--flag value`` pairs whose key names a secret (``token``, ``api_key``,
``password``, ``secret``… as its last word), except numbers, booleans, absolute
paths and a tokenizer's special tokens (``bos_token``, ``eos_token``…).

A purely computational module with no side effects.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

REDACTED = "[redacted]"


@dataclass(frozen=True)
class Shape:
    name: str  # what it is, for a person: "a Hugging Face token"
    pattern: re.Pattern[str]
    accept: Callable[[re.Match[str]], bool] = lambda match: True
    hints: tuple[str, ...] = ()  # lower-case text one of which a match holds; () any text


def _mixed(text: str, digits: int = 1) -> bool:
    return (any(c.isupper() for c in text) and any(c.islower() for c in text)
            and sum(c.isdigit() for c in text) >= digits)


def entropy(text: str) -> float:
    """Shannon entropy of ``text``, in bits per character."""
    counts = Counter(text)
    size = len(text)
    return -sum(n / size * math.log2(n / size) for n in counts.values()) if size else 0.0


def random_looking(text: str) -> bool:
    """Whether one run of ``[A-Za-z0-9+=]`` is a long random string (see the module)."""
    if len(text) < 20 or not _mixed(text, digits=2):
        return False
    return entropy(text) >= (4.0 if len(text) >= 32 else 3.5)


SHAPES: tuple[Shape, ...] = (
    Shape("a private key", re.compile(
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?:[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----)?"),
        hints=("private key",)),
    Shape("a JSON Web Token", re.compile(
        r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), hints=("eyj",)),
    Shape("a Hugging Face token", re.compile(r"hf_[A-Za-z0-9]{30,}")),
    Shape("a GitHub token", re.compile(r"gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,}")),
    Shape("an OpenAI-style key (sk-…)",
          re.compile(r"sk-(?:[a-z]{2,8}-)?(?P<body>[A-Za-z0-9_-]{20,})"),
          lambda m: _mixed(m.group("body"))),
    Shape("an AWS access key id", re.compile(r"(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")),
    Shape("an Authorization header", re.compile(
        r"(?i:authorization\s*[:=]\s*(?:(?:bearer|basic|token)[ \t]+)?)"
        r"(?P<secret>(?!\[redacted\]|(?i:bearer|basic|token)(?:[ \t]|$))[^\s\"',;\\]+)"
        r"|(?i:\bbearer[ \t]+)(?P<bearer>(?!\[redacted\])[A-Za-z0-9._~+/-]{8,}=*)"),
          hints=("authorization", "bearer")),
    Shape("a password in a URL", re.compile(r"(?<=://)[^\s/:@\"'\\]+:(?P<secret>[^\s/@\"'\\]+)(?=@)"),
          lambda m: m.group("secret") != REDACTED, hints=("://",)),
    Shape("a long random string", re.compile(r"[A-Za-z0-9+=]{20,}"),
          lambda m: random_looking(m.group(0))),
)

# A key names a secret when its last word is one of these: `hf_token`, `--api-key`,
# `AWS_SECRET_ACCESS_KEY`, `password`; not `max_tokens`, `tokenizer` or
# `--long-prefill-token-threshold` (the word must be followed by the separator).
_NOUN = (r"(?:token|secret|secret[_-]?key|password|passwd|pwd|api[_-]?key|apikey"
         r"|access[_-]?key|private[_-]?key|credentials?)")
_VALUE = r"(?P<value>[^\s\"'`,;&)}\]\\]+)"
_PAIRS = (  # key=value and key: value; --flag value (the key must start with a dash)
    re.compile(rf"(?i)(?<![A-Za-z0-9/])(?P<key>{_NOUN})(?P<sep>[\"']?\s*[=:]\s*[\"']?){_VALUE}"),
    re.compile(rf"(?i)(?<=[_.-])(?P<key>{_NOUN})(?P<sep>[ \t]+[\"']?){_VALUE}"),
)
_PAIR_HINTS = ("token", "secret", "passw", "pwd", "key", "credential")
_WORD = re.compile(r"[A-Za-z0-9_.-]*$")
_FLAG = re.compile(r"(?:^|-)(?:api-key|apikey|token|secret|secret-key|password|passwd"
                   r"|access-key|private-key|credentials?)$")
# A tokenizer's special tokens are no secrets: `add_bos_token=bool:false`, `eos_token: </s>`.
_TOKENIZER_KEY = re.compile(r"(?i)(?:bos|eos|pad|unk|sep|cls|mask|eot|eom|eog|special)[_.-]?token$")
_PLAIN_VALUE = re.compile(r"[\d.]+|true|false|none|null|\*+|\[redacted.*", re.IGNORECASE)


def shape(text: str) -> str | None:
    """What secret ``text`` holds (``"a Hugging Face token"``), or None when :func:`scrub`
    leaves it as it is: what ``llmgw validate`` says of a value, without quoting it."""
    for candidate in SHAPES:
        for match in candidate.pattern.finditer(text):
            if candidate.accept(match):
                return candidate.name
    if _pairs(text) != text:
        return "a value under a secret's name (token=…, --api-key …)"
    return None


def secret_flag(flag: str) -> bool:
    """Whether an engine flag takes a secret as its value (``api-key``, ``hf-token``,
    ``ssl-keyfile-password``): its last word names one. ``api-key-file`` does not."""
    return bool(_FLAG.search(flag.lower().lstrip("-").replace("_", "-")))


# What every shape and pair starts with or needs: text without any of it is left as it is
# without running the rest (a fleet snapshot holds a hundred thousand short strings).
_ANY = re.compile(r"hf_|sk-|gh[pousr]_|github_pat_|AKIA|ASIA|eyJ|PRIVATE KEY|://[^\s/]*@"
                  r"|[A-Za-z0-9+=]{20}|(?i:authorization|bearer|token|secret|passw|pwd|api_?-?key"
                  r"|access.?key|private.?key|credential)")


@functools.lru_cache(maxsize=32768)
def scrub(text: str) -> str:
    """``text`` with every secret shape and every secret-named value replaced by
    ``[redacted]``; idempotent. What names a secret stays: ``Authorization: Bearer
    [redacted]``, ``hf_token=[redacted]``, ``https://user:[redacted]@host``."""
    if not _ANY.search(text):
        return text
    for candidate in SHAPES:
        if _hinted(candidate.hints, text):
            text = candidate.pattern.sub(functools.partial(_hide, candidate), text)
    return _pairs(text)


def _hinted(hints: tuple[str, ...], text: str) -> bool:
    """Whether a pattern can match: a cheap test before the regex (most text has no hint)."""
    if not hints:
        return True
    lowered = text.lower()
    return any(hint in lowered for hint in hints)


def _pairs(text: str) -> str:
    if _hinted(_PAIR_HINTS, text):
        for pair in _PAIRS:
            text = pair.sub(_hide_value, text)
    return text


def _hide(candidate: Shape, match: re.Match[str]) -> str:
    if not candidate.accept(match):
        return match.group(0)
    kept = next((name for name in ("secret", "bearer") if name in candidate.pattern.groupindex
                 and match.group(name) is not None), None)
    if kept is None:
        return REDACTED
    start, end = match.span(kept)
    whole = match.group(0)
    return whole[:start - match.start()] + REDACTED + whole[end - match.start():]


def _hide_value(match: re.Match[str]) -> str:
    value = match.group("value")
    before = _WORD.search(match.string, max(0, match.start() - 64), match.start())
    word = (before.group(0) if before else "") + match.group("key")
    flag_form = match.group("sep").lstrip("\"'").lstrip()[:1] not in ("=", ":")
    if value.startswith("/") or _PLAIN_VALUE.fullmatch(value) or \
            _TOKENIZER_KEY.search(word) or (flag_form and not word.startswith("-")):
        return match.group(0)
    return match.group("key") + match.group("sep") + REDACTED
