"""JSON Schema for one cluster file, for editors (yaml-language-server) and CI.

A file may hold any subset of the sections, so nothing is required at the top
level; the merged directory is checked by ``llmgw validate``. The schema is
draft-07 with ``definitions``, which every yaml-language-server release reads.
"""

from __future__ import annotations

import json
from typing import Any

from llmgw import __version__
from llmgw.spec.models import Cluster

SCHEMA_ID = "https://llmgw.dev/schema/cluster-file.json"


def cluster_file_schema() -> dict[str, Any]:
    schema = Cluster.model_json_schema(ref_template="#/definitions/{model}")
    definitions = schema.pop("$defs", {})
    schema.pop("required", None)
    _close_name_maps(schema)
    for definition in definitions.values():
        _close_name_maps(definition)
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": SCHEMA_ID,
        **schema,
        "title": f"llmgw cluster file (llmgw {__version__})",
        "description": "One file of a cluster directory: any of cluster, fabrics, nodes, "
        "models, projects.",
        "definitions": definitions,
    }


def _close_name_maps(node: Any) -> None:
    """Maps keyed by name: a key that is not a valid name is an error, as in the loader."""
    if isinstance(node, dict):
        if "patternProperties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _close_name_maps(value)
    elif isinstance(node, list):
        for value in node:
            _close_name_maps(value)


def dumps() -> str:
    return json.dumps(cluster_file_schema(), indent=2, sort_keys=False) + "\n"
