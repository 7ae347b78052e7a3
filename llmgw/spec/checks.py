"""Meaning checks on a cluster whose shape is already valid.

This is a purely computational module with no side effects: it reads a
:class:`~llmgw.spec.models.Cluster` and returns :class:`Problem` values
addressed by data path; the loader turns paths into ``file:line:col``.

Capacity arithmetic uses the GPUs that nodes *declare*. Declarations are
optional (the agent's report is the truth), so a class no node declares is
only an error when the cluster declares GPUs at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from llmgw.spec import allowlists, gpus, hosts, loras, secrets, sources, upstreams
from llmgw.spec.models import Cluster, Profile
from llmgw.spec.quantities import count
from llmgw.spec.servings import Pricing

Path = tuple[str | int, ...]
# What partials.py puts in place of a malformed source: never a problem of its own.
PLACEHOLDER_SOURCE = "/placeholder"


@dataclass(frozen=True)
class Problem:
    path: Path
    message: str
    at_key: bool = False  # point at the key rather than its value
    fleet_wide: bool = False  # depends on every node (capacity, fabrics)


def is_relative_path(text: str) -> bool:
    """``./x`` and ``../x`` are paths relative to the cluster directory; ``org/name`` is not."""
    return text.startswith(("./", "../"))


def known_classes(cluster: Cluster) -> dict[str, gpus.GpuClass]:
    """Built-in GPU classes plus those the cluster declares."""
    table = dict(gpus.BUILTIN)
    for name, decl in cluster.cluster.gpu_classes.items():
        major, minor = (int(p) for p in decl.compute_capability.split("."))
        table[name] = gpus.GpuClass(name, name.rsplit("-", 1)[0], decl.memory_gib,
                                    (major, minor), "declared in cluster.gpu_classes")
    return table


def check(cluster: Cluster, dropped: set[tuple[str, str]] | None = None) -> list[Problem]:
    """Every meaning problem in ``cluster``, in a stable order.

    ``dropped`` names entries (section, name) that had shape errors and were left
    out: references to them are not errors, and fleet-wide arithmetic, which would
    miss them, is skipped.
    """
    dropped = dropped or set()
    classes = known_classes(cluster)
    partial = any(section == "nodes" for section, _ in dropped)
    problems = [
        *_node_problems(cluster, classes, {n for s, n in dropped if s == "fabrics"}),
        *_model_problems(cluster, classes),
        *(Problem(("models", *path), message) for path, message in loras.problems(
            cluster.models)),
        *_sso_problems(cluster, {n for s, n in dropped if s == "projects"}),
        *_budget_problems(cluster),
    ]
    if not any(section == "models" for section, _ in dropped):  # a dropped model may match
        problems += [Problem(path, message) for path, message in allowlists.problems(cluster)]
        problems += [Problem(path, message) for path, message in upstreams.problems(cluster)]
    if partial:
        problems = [p for p in problems if not p.fleet_wide]
    return problems


def _sso_problems(cluster: Cluster, dropped: set[str]) -> Iterator[Problem]:
    """A group of ``cluster.web.oidc.groups`` that grants a project the cluster lacks."""
    oidc = cluster.cluster.web.oidc
    for group, grant in (oidc.groups.items() if oidc else ()):
        for field, granted in (("projects", grant.projects), ("admin_of", grant.admin_of)):
            for i, project in enumerate(granted):
                if project not in cluster.projects and project not in dropped:
                    known = ", ".join(sorted(cluster.projects)) or "none"
                    what = "project" if field == "projects" else "the admin role of project"
                    yield Problem(("cluster", "web", "oidc", "groups", group, field, i),
                                  f"group {group!r} grants {what} {project!r}, which is not "
                                  f"defined (projects: {known})")
def _budget_problems(cluster: Cluster) -> Iterator[Problem]:
    """A budget binds only through prices: a project with one while every model it may call
    (its ``models:`` allow-list, :mod:`llmgw.spec.allowlists`) is free would spend without
    limit. An error, as every problem here (validate has no warnings): an operator who
    wrote a budget believes spend is capped. No model at all (a fresh ``llmgw init``), or
    none the project may call, is no problem: nothing can be spent yet."""
    priced = _priced_names(cluster)
    for name, project in cluster.projects.items():
        usd, period = project.limit()
        callable_ = allowlists.allowed(project.models, priced)
        if not usd or not callable_ or any(priced[n] for n in callable_):
            continue  # a zero budget refuses every request: it binds without prices
        field = "budget" if project.budget is not None else "budget_usd"
        per = "" if period.kind == "none" else f" a {period.kind}"
        yield Problem(
            ("projects", name, field),
            f"project {name!r} has a budget of ${usd:,.2f}{per} that never binds: no "
            "model it can call has a price, so every request costs $0; give its "
            "models a price (`pricing: "
            "{input_per_mtok: 0.5, output_per_mtok: 1.5}`, USD per million tokens) or "
            f"remove `{field}`", at_key=True)


def _priced_names(cluster: Cluster) -> dict[str, bool]:
    """Every served name (models and adapters) → whether a request to it costs anything: an
    adapter without prices of its own is billed at its base model's (router.catalogs)."""
    def paid(prices: Pricing) -> bool:
        return prices.input_per_mtok > 0 or prices.output_per_mtok > 0

    names = {}
    for key, model in cluster.models.items():
        names[model.served_name or key] = paid(model.pricing)
        for adapter in model.adapters:
            names[adapter.name] = paid(adapter.pricing or model.pricing)
    return names


def _class_hint(name: str, classes: dict[str, gpus.GpuClass]) -> str:
    family = name.split("-")[0]
    same_family = sorted(c for c in classes if c.split("-")[0] == family)
    if same_family:
        return f" (classes are named from the memory the driver reports: {', '.join(same_family)})"
    return " (see `llmgw validate --classes`, or declare it under cluster.gpu_classes)"


def _node_problems(
    cluster: Cluster, classes: dict[str, gpus.GpuClass], dropped_fabrics: set[str]
) -> Iterator[Problem]:
    local_owner: str | None = None
    endpoints: dict[tuple[str, int], str] = {}
    for name, node in cluster.nodes.items():
        base: Path = ("nodes", name)
        if node.is_local:
            if local_owner is not None:
                yield Problem((*base, "address"),
                              f"nodes.{name}: address 'local' is already used by node "
                              f"'{local_owner}'; only one node can be this machine")
            local_owner = local_owner or name
        else:
            endpoint = (node.address, node.ssh_port or cluster.cluster.ssh.port)
            if endpoint in endpoints:
                yield Problem((*base, "address"),
                              f"nodes.{name}: {endpoint[0]} port {endpoint[1]} is already node "
                              f"'{endpoints[endpoint]}'")
            endpoints.setdefault(endpoint, name)
        for fabric, adapters in node.fabrics.items():
            if fabric not in cluster.fabrics and fabric not in dropped_fabrics:
                defined = ", ".join(sorted(cluster.fabrics)) or "none"
                yield Problem((*base, "fabrics", fabric),
                              f"nodes.{name}.fabrics: undefined fabric '{fabric}' "
                              f"(defined: {defined})", at_key=True)
            if not adapters:
                yield Problem((*base, "fabrics", fabric),
                              f"nodes.{name}.fabrics.{fabric}: list the node's adapters on "
                              "this fabric, e.g. [mlx5_0, mlx5_1]")
            need = cluster.fabrics[fabric].min_adapters if fabric in cluster.fabrics else None
            if adapters and need is not None and len(adapters) < need:
                yield Problem((*base, "fabrics", fabric),
                              f"nodes.{name}.fabrics.{fabric}: "
                              f"{count(len(adapters), 'adapter')} declared, but fabric "
                              f"'{fabric}' has min_adapters: {need}")
        for index, path in enumerate(node.weights_dirs):
            if not path.startswith("/") and not (node.on_this_machine
                                                 and is_relative_path(path)):
                yield Problem((*base, "weights_dirs", index),
                              f"nodes.{name}.weights_dirs[{index}]: {path!r} must be an "
                              "absolute path (relative paths, starting with ./ or ../, only "
                              "on the `local` node or one at a loopback address)")
        for index, decl in enumerate(node.gpus):
            if decl.gpu_class not in classes:
                yield Problem((*base, "gpus", index, "class"),
                              f"nodes.{name}.gpus[{index}]: unknown GPU class "
                              f"'{decl.gpu_class}'" + _class_hint(decl.gpu_class, classes))


def _model_problems(cluster: Cluster, classes: dict[str, gpus.GpuClass]) -> Iterator[Problem]:
    served: dict[str, str] = {}
    for name, model in cluster.models.items():
        base: Path = ("models", name)
        public = model.served_name or name
        if public in served:
            yield Problem((*base, "served_name") if model.served_name else base,
                          f"models.{name}: clients would call it '{public}', which model "
                          f"'{served[public]}' already answers to", at_key=True)
        served.setdefault(public, name)
        if model.scaling.min > model.scaling.max:
            yield Problem((*base, "scaling", "min"),
                          f"models.{name}.scaling: min {model.scaling.min} is greater than "
                          f"max {model.scaling.max}")
        if model.source is None and any(p.source is None for p in model.profiles):
            yield Problem(base, f"models.{name}: no `source` for the model or its profiles "
                          "(a Hugging Face repo id or a path on the node)", at_key=True)
        yield from _source_problems(cluster, (*base, "source"), f"models.{name}.source",
                                    model.source)
        for index, adapter in enumerate(model.adapters):
            yield from _source_problems(cluster, (*base, "adapters", index, "source"),
                                        f"models.{name}.adapters[{index}].source",
                                        adapter.source)
        for index, profile in enumerate(model.profiles):
            yield from _source_problems(cluster, (*base, "profiles", index, "source"),
                                        f"models.{name}.profiles[{index}].source",
                                        profile.source)
            yield from _profile_problems(cluster, classes, (*base, "profiles", index), profile)


def _source_problems(cluster: Cluster, path: Path, where: str,
                     text: str | None) -> Iterator[Problem]:
    """An URL source whose host is never public, unless the site lists it; a path source
    no node may serve (every node declares weights_dirs, and none holds it)."""
    if text is None:
        return
    source = sources.parse(text)  # the shape check already passed
    if source.kind == "path":
        yield from _path_problems(cluster, path, where, source.path or text)
        return
    if source.kind != "url":
        return
    host = urlsplit(source.url or "").hostname or ""
    settings = cluster.cluster.weights
    mirror = urlsplit(settings.endpoint).hostname if settings.endpoint else None
    if hosts.listed(host, [*settings.allowed_hosts, *([mirror] if mirror else [])]):
        return
    why = hosts.literal_refusal(host)
    if why is not None:
        yield Problem(path, f"{where}: {why}: weights are fetched from public addresses "
                      f"only; list {hosts.canonical(host)} under cluster.weights.allowed_hosts "
                      "if the site means it")


def _path_problems(cluster: Cluster, path: Path, where: str, text: str) -> Iterator[Problem]:
    # A node serves path sources from under the weights_dirs it declares only, so a
    # cluster file cannot point an engine at /etc/passwd (issue 23). A node that
    # declares none serves no path source at all.
    dirs = {name: node.weights_dirs for name, node in cluster.nodes.items()}
    if text == PLACEHOLDER_SOURCE or not dirs or any(
            held and sources.within(text, held) for held in dirs.values()):
        return
    declared = "; ".join(f"{name}: {', '.join(held)}"
                         for name, held in sorted(dirs.items()) if held) or "none declares any"
    yield Problem(path, f"{where}: {text} is in no node's weights_dirs ({declared}); a path "
                  "source must lie under the weights_dirs of the nodes that serve it",
                  fleet_wide=True)


def _profile_problems(
    cluster: Cluster, classes: dict[str, gpus.GpuClass], base: Path, profile: Profile
) -> Iterator[Problem]:
    where = f"{base[0]}.{base[1]}.profiles[{base[3]}]"
    unknown = [c for c in profile.gpu_classes if c not in classes]
    for name in unknown:
        yield Problem((*base, "gpu_class"),
                      f"{where}: unknown GPU class '{name}'" + _class_hint(name, classes))
    yield from _secret_values(base, where, profile)
    known = [classes[c] for c in profile.gpu_classes if c in classes]
    arithmetic = list(_arithmetic(base, where, profile))
    yield from arithmetic
    if profile.tensor_parallel > 1 and len({(c.memory_gib, c.compute_capability)
                                            for c in known}) > 1:
        yield Problem((*base, "gpu_class"),
                      f"{where}: a tensor-parallel group would mix GPU classes "
                      f"{', '.join(c.name for c in known)}; shards must be identical — use one "
                      "class per profile and add a profile for the other")
    for field_name in ("dtype", "quantization", "kv_cache_dtype"):
        value = getattr(profile, field_name)
        if value and "fp8" in value.lower():
            weak = [c for c in known if not c.supports_fp8]
            for cls in weak:
                cc = ".".join(map(str, cls.compute_capability))
                yield Problem((*base, field_name),
                              f"{where}: {field_name} {value} needs compute capability 8.9 or "
                              f"newer; {cls.name} has {cc}")
    if unknown or arithmetic:
        return  # capacity questions only make sense for a well-formed profile
    if profile.nodes > 1 and not profile.cpu:
        # A CPU replica's ranks talk over the management network (gloo), not a fabric.
        yield from _fabric_for(cluster, base, where, profile)
    if not profile.cpu:
        yield from _declared_capacity(cluster, base, where, profile)


# Where an engine reads the value of a secret flag from its environment, for the hint.
_SECRET_ENV = {("api-key", "vllm"): "VLLM_API_KEY", ("api-key", "llama.cpp"): "LLAMA_API_KEY",
               ("hf-token", "vllm"): "HF_TOKEN", ("hf-token", "llama.cpp"): "HF_TOKEN",
               ("hf-token", "sglang"): "HF_TOKEN"}
_PUBLIC = ("a profile's {what} public (the unit file, every plan, the pull request comment "
           "and the fleet snapshot show it); ")


def _secret_values(base: Path, where: str, profile: Profile) -> Iterator[Problem]:
    """Secrets written as values where everything is public: a flag that takes one
    (``api-key``) with a literal value, or any value of ``args`` or ``env`` shaped like a
    credential (:mod:`llmgw.spec.secrets`). The value is never quoted."""
    for section in ("args", "unchecked_args"):
        for flag, value in getattr(profile, section).items():
            if value is None or isinstance(value, bool):
                continue
            variable = _SECRET_ENV.get((flag, profile.engine))
            if secrets.secret_flag(flag):
                via = f"secret_env: {{{variable}: /path/on/the/node}}" if variable else \
                    "secret_env (a variable the engine reads it from, its value a file on the node)"
                yield Problem((*base, section, flag),
                              f"{where}.{section}.{flag}: `--{flag}` takes a secret, and "
                              + _PUBLIC.format(what=f"{section} are")
                              + f"give the engine its value through {via} instead (see "
                              "docs/security.md, Secrets)")
                continue
            found = secrets.shape(str(value))
            if found:
                yield Problem((*base, section, flag),
                              f"{where}.{section}.{flag}: the value looks like {found} "
                              "(not shown here); " + _PUBLIC.format(what=f"{section} are")
                              + "put a secret in a file on the node and name it under "
                              "secret_env (see docs/security.md, Secrets)")
    for variable, value in profile.env.items():
        found = secrets.shape(value)
        if found:
            yield Problem((*base, "env", variable),
                          f"{where}.env.{variable}: the value looks like {found} (not shown "
                          "here); " + _PUBLIC.format(what="env is")
                          + f"put it in a file on the node and name that file under "
                          f"secret_env instead: `secret_env: {{{variable}: /path/on/the/node}}` "
                          "(see docs/security.md, Secrets)")


def _arithmetic(base: Path, where: str, profile: Profile) -> Iterator[Problem]:
    if profile.cpu and profile.engine != "vllm":
        if profile.world_size > 1 or profile.nodes > 1:
            yield Problem((*base, "nodes" if profile.nodes > 1 else "tensor_parallel"),
                          f"{where}: a CPU profile runs one process on one node; "
                          "tensor_parallel, pipeline_parallel and nodes must be 1")
        return
    if profile.cpu:
        # vLLM's CPU backend runs world_size worker processes, split evenly over
        # the nodes (gloo over TCP between them: no fabric, no GPUs).
        if profile.world_size % profile.nodes:
            yield Problem((*base, "nodes"),
                          f"{where}: tensor_parallel × pipeline_parallel = "
                          f"{profile.tensor_parallel} × {profile.pipeline_parallel} = "
                          f"{profile.world_size} workers cannot be split evenly over "
                          f"{profile.nodes} nodes")
        return
    if profile.engine == "llama.cpp" and profile.nodes > 1:
        yield Problem((*base, "nodes"), f"{where}: llama.cpp replicas cannot span nodes")
    if profile.world_size % profile.nodes:
        yield Problem((*base, "nodes"),
                      f"{where}: tensor_parallel × pipeline_parallel = "
                      f"{profile.tensor_parallel} × {profile.pipeline_parallel} = "
                      f"{profile.world_size} GPUs cannot be split evenly over "
                      f"{profile.nodes} nodes")
    elif profile.nodes > 1 and (profile.gpus_per_node % profile.tensor_parallel
                                and profile.tensor_parallel % profile.gpus_per_node):
        yield Problem((*base, "tensor_parallel"),
                      f"{where}: {profile.gpus_per_node} GPUs per node split tensor-parallel "
                      f"groups of {profile.tensor_parallel} unevenly across nodes")


def _fabric_for(cluster: Cluster, base: Path, where: str, profile: Profile) -> Iterator[Problem]:
    """A multi-node replica needs `nodes` nodes that share one fabric."""
    declaring = any(n.gpus for n in cluster.nodes.values())
    best: tuple[int, str] = (0, "")
    missing_mgmt: set[str] = set()
    for fabric in sorted(cluster.fabrics):
        members = []
        for name, node in cluster.nodes.items():
            if fabric not in node.fabrics:
                continue
            if declaring and _declared(node, profile) < profile.gpus_per_node:
                continue
            if node.mgmt_interface is None:
                missing_mgmt.add(name)
                continue
            members.append(name)
        best = max(best, (len(members), fabric))
    if best[0] >= profile.nodes:
        return
    detail = f"the most on one fabric is {best[0]} ({best[1]})" if best[1] else "no fabrics"
    if missing_mgmt:
        detail += ("; nodes without mgmt_interface cannot join: "
                   + ", ".join(sorted(missing_mgmt)))
    classes = "/".join(profile.gpu_classes)
    yield Problem((*base, "nodes"), fleet_wide=True, message=
                  f"{where}: no fabric can carry a {profile.nodes}-node replica: it needs "
                  f"{profile.nodes} nodes on one fabric"
                  + (f" with {profile.gpus_per_node} {classes} GPUs each" if declaring else "")
                  + f"; {detail}")


def _declared(node: object, profile: Profile) -> int:
    gpu_decls = getattr(node, "gpus", [])
    return sum(d.count for d in gpu_decls if d.gpu_class in profile.gpu_classes)


def _declared_capacity(
    cluster: Cluster, base: Path, where: str, profile: Profile
) -> Iterator[Problem]:
    if not any(n.gpus for n in cluster.nodes.values()):
        return  # nothing declared: the agents' reports will tell
    counts = {name: _declared(node, profile) for name, node in cluster.nodes.items()}
    most = max(counts.values(), default=0)
    classes = "/".join(profile.gpu_classes)
    if most == 0:
        yield Problem((*base, "gpu_class"), f"{where}: no node declares {classes} GPUs",
                      fleet_wide=True)
    elif most < profile.gpus_per_node:
        owner = sorted(n for n, c in counts.items() if c == most)[0]
        yield Problem((*base, "tensor_parallel"), fleet_wide=True, message=
                      f"{where}: needs {profile.gpus_per_node} {classes} GPUs per node; the "
                      f"most any node declares is {most} ({owner})")
