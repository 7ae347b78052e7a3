"""``llmgw models search|show``: the catalog, over a mirror directory and the hub.

``search TEXT`` lists the repos whose id holds TEXT in the mirror directory
(``--mirror DIR``, read on this machine) and, unless ``--offline``, on the
hub (``--hub``, else ``$HF_ENDPOINT``, else the public hub): sizes,
quantisations, architecture and context. ``show ID[:QUANT]`` adds every
file, the parameters, the fit on each GPU class at each context
(:mod:`llmgw.planning.fits`) and the ``source`` and ``shape`` lines to paste
into a cluster file. A hub that cannot be reached is one line, not an error,
when the mirror answered.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from llmgw.cli.errors import UserError
from llmgw.discovery.architectures import Architecture
from llmgw.hub import listings
from llmgw.hub.listings import Listing, ListingError
from llmgw.planning import fits
from llmgw.spec import gpus
from llmgw.spec.identifiers import check_text
from llmgw.spec.shapes import Shape

PUBLIC_HUB = "https://huggingface.co"
DEFAULT_CLASSES = fits.CATALOG_CLASSES
DEFAULT_CONTEXTS = (8192, 32768)
MAX_FILES = 30  # file rows `show` prints


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "models", help="the catalog: what a mirror and the hub hold, and what fits",
        description="Search and show models in a mirror directory and on the hub "
        "($HF_ENDPOINT): sizes, quantisations, architecture, context, and the fit per GPU "
        "class (docs/choosing-models.md).",
    )
    commands = parser.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    search = commands.add_parser("search", help="repos whose id holds TEXT")
    search.add_argument("text", metavar="TEXT")
    search.add_argument("--limit", type=int, default=20, metavar="N",
                        help="at most N repos from the hub (default 20)")
    _common(search)
    search.set_defaults(handler=run_search)
    show = commands.add_parser("show", help="one repo: files, figures and the fit")
    show.add_argument("repo", metavar="ID", help="org/name[@revision][:QUANT or files]")
    show.add_argument("--gpu-class", action="append", metavar="CLASS", dest="classes",
                      help=f"GPU classes to fit (repeatable; default {', '.join(DEFAULT_CLASSES)})")
    show.add_argument("--context", action="append", type=int, metavar="TOKENS",
                      dest="contexts", help="contexts to fit (repeatable; default 8192 and "
                      "32768, and the model's own when longer)")
    _common(show)
    show.set_defaults(handler=run_show)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mirror", type=Path, metavar="DIR",
                        help="a mirror directory on this machine (DIR/hub, as `llmgw mirror` "
                        "fills it)")
    parser.add_argument("--hub", metavar="URL",
                        help="the hub to ask (default: $HF_ENDPOINT, else the public hub)")
    parser.add_argument("--offline", action="store_true",
                        help="ask no hub (also when $HF_HUB_OFFLINE is 1)")
    parser.add_argument("--token-file", type=Path, metavar="FILE",
                        help="a file holding a hub token, for gated repos")


def _endpoint(args: argparse.Namespace) -> str | None:
    """The hub to ask, or None for none."""
    if args.offline or os.environ.get("HF_HUB_OFFLINE", "") in ("1", "true", "True"):
        return None
    return str(args.hub or os.environ.get("HF_ENDPOINT") or PUBLIC_HUB).rstrip("/")


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file is None:
        return None
    try:
        return args.token_file.read_text().strip() or None
    except OSError as exc:
        raise UserError(f"cannot read {args.token_file}: {exc.strerror}") from None


def _root(args: argparse.Namespace) -> Path | None:
    if args.mirror is None:
        return None
    root: Path = args.mirror / "hub"
    if not root.is_dir():
        raise UserError(f"{args.mirror} has no hub/ directory: fill it with `llmgw mirror "
                        "pull` or `llmgw mirror add`")
    return root


def _printable(text: str) -> str:
    """What a hub said, as it may reach a terminal: no control characters."""
    try:
        check_text(text)
        return text
    except ValueError:
        return "".join(c if c.isprintable() else "?" for c in text)


# -- search -----------------------------------------------------------------------


def run_search(args: argparse.Namespace) -> int:
    if not args.text or len(args.text) > 200 or not args.text.isprintable():
        raise UserError("TEXT is 1 to 200 printable characters")
    if not 1 <= args.limit <= 1000:
        raise UserError("--limit is from 1 to 1000")
    root, endpoint, token = _root(args), _endpoint(args), _token(args)
    if root is None and endpoint is None:
        raise UserError("nothing to search: give --mirror DIR, or leave out --offline")
    rows: list[Listing] = []
    notes: list[str] = []
    if root is not None:
        for repo in listings.mirror_repos(root, args.text):
            try:
                rows.append(listings.from_mirror(root, repo))
            except ListingError as exc:
                notes.append(f"{repo}: {exc}")
    if endpoint is not None:
        try:
            found = listings.hub_search(endpoint, args.text, args.limit, token)
        except ListingError as exc:
            if root is None:
                raise UserError(str(exc)) from None
            notes.append(str(exc))
            found = []
        for repo in found:
            try:
                rows.append(listings.from_hub(endpoint, _printable(repo), token, header=False))
            except ListingError as exc:
                notes.append(f"{_printable(repo)}: {exc}")
    print(search_table(rows) if rows else f"no repo holds {args.text!r}")
    for note in notes:
        print(f"note: {_printable(note)}", file=sys.stderr)
    return 0


def search_table(rows: list[Listing]) -> str:
    table = [("REPO", "WHERE", "SIZE", "QUANTISATIONS", "ARCHITECTURE", "CONTEXT")]
    for row in rows:
        arch = row.architecture or Architecture()
        quants = ",".join(row.quantisations) or "-"
        unread = "(see show)" if row.note == listings.HEADER_UNREAD else "unknown"
        table.append((row.repo, row.where, size(row.size), quants,
                      _printable(arch.architecture or unread),
                      fits.tokens(arch.context_length) if arch.context_length else unread))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
                     for r in table)


# -- show -------------------------------------------------------------------------


def run_show(args: argparse.Namespace) -> int:
    root, endpoint, token = _root(args), _endpoint(args), _token(args)
    classes = args.classes or list(DEFAULT_CLASSES)
    unknown = [c for c in classes if c not in gpus.BUILTIN]
    if unknown:
        raise UserError(f"unknown GPU class {', '.join(unknown)} (see `llmgw validate "
                        "--classes`)")
    if any(c <= 0 or c > 100_000_000 for c in args.contexts or ()):
        raise UserError("--context is a number of tokens from 1 to 100000000")
    listing = None
    problems = []
    if root is not None:
        try:
            listing = listings.from_mirror(root, args.repo)
        except ListingError as exc:
            problems.append(f"mirror: {exc}")
    if listing is None and endpoint is not None:
        try:
            listing = listings.from_hub(endpoint, args.repo, token)
        except ListingError as exc:
            problems.append(f"hub: {exc}")
    if listing is None:
        raise UserError("; ".join(problems) or "nothing to ask: give --mirror DIR, or leave "
                        "out --offline")
    print(show_text(listing, classes, args.contexts))
    return 0


def show_text(listing: Listing, classes: list[str], contexts: list[int] | None) -> str:
    arch = listing.architecture or Architecture()
    commit = f", commit {listing.commit[:12]}" if listing.commit else ""
    lines = [f"{listing.repo} ({listing.where}{commit})"]
    if listing.architecture is None:
        lines.append(f"  architecture   unknown: {_printable(listing.note)}")
    else:
        heads = (f", {arch.kv_heads} KV head{'s' if arch.kv_heads != 1 else ''} of "
                 f"{arch.head_dim}" if arch.kv_heads and arch.head_dim else "")
        layers = f": {arch.layers} layers" if arch.layers else ""
        context = (f", context {arch.context_length} tokens" if arch.context_length else
                   ", context unknown")
        lines.append(f"  architecture   {_printable(arch.architecture or 'unknown')}{layers}"
                     f"{heads}{context}")
        params = (f"{arch.params / 1e9:.3g}B ({arch.params_from})" if arch.params
                  else "unknown")
        lines.append(f"  parameters     {params}")
        if arch.dtype:
            lines.append(f"  dtype          {_printable(arch.dtype)}")
    lines.append(f"  quantisations  {', '.join(listing.quantisations) or 'none in file names'}")
    lines.append(f"  files          {len(listing.files)}, weights {size(listing.size)}")
    chosen = listing.chosen()
    picked = {f.path for f in chosen}
    width = max((len(_printable(f.path)) for f in listing.files[:MAX_FILES]), default=0)
    for item in listing.files[:MAX_FILES]:
        mark = "*" if item.path in picked else " "
        lines.append(f"   {mark} {_printable(item.path):<{width}}  {size(item.size):>10}  "
                     f"{item.quantisation or ''}".rstrip())
    if len(listing.files) > MAX_FILES:
        lines.append(f"     … and {len(listing.files) - MAX_FILES} more")
    weights, shape = listing.loaded, listing.shape()
    found = fits.of_shape(shape, weights)
    wanted = sorted(set(contexts or [*DEFAULT_CONTEXTS, *(
        [arch.context_length] if arch.context_length and arch.context_length >
        DEFAULT_CONTEXTS[-1] else [])]))
    lines.append(f"  fit            * files loaded as they are ({size(weights or 0)}), "
                 "16-bit KV cache, 1 sequence, 90% of each GPU (docs/choosing-models.md)")
    for name in classes:
        lines.append(f"    {name:<12} {fits.fit_line(found, gpus.BUILTIN[name], wanted)}")
    lines += ["  in a cluster file:", f"    source: {_source_line(listing, chosen)}",
              f"    shape: {_shape_line(shape)}"]
    return "\n".join(lines)


def _source_line(listing: Listing, chosen: tuple[listings.File, ...]) -> str:
    quants = {f.quantisation for f in chosen}
    if len(listing.quantisations) > 1 and len(quants) == 1 and None not in quants:
        return f"{listing.repo}:{quants.pop()}"
    return listing.repo


def _shape_line(shape: Shape) -> str:
    parts = []
    for key in Shape.model_fields:
        value = getattr(shape, key)
        if value is not None:
            parts.append(f"{key}: {size_text(value) if key == 'weights_size' else value}")
    return "{" + ", ".join(parts) + "}"


def size(count: int) -> str:
    """``241.4 MiB``, ``15.0 GiB``: sizes as the fit check counts them."""
    if count >= 1024**3:
        return f"{count / 1024**3:.1f} GiB"
    if count >= 1024**2:
        return f"{count / 1024**2:.1f} MiB"
    return f"{count / 1024:.1f} KiB" if count >= 1024 else f"{count} B"


def size_text(count: int) -> str:
    """A size as a cluster file takes it, rounded up so the check never under-counts."""
    mib = -(-count // 1024**2)
    return f"{mib}MiB"
