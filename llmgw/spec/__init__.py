"""Desired state: cluster files, their types, and loading them with locations."""

from llmgw.spec.models import (
    Cluster,
    ClusterSettings,
    Fabric,
    Model,
    Node,
    Profile,
    Project,
)
from llmgw.spec.servings import Pricing, Scaling

__all__ = [
    "Cluster", "ClusterSettings", "Fabric", "Model", "Node", "Pricing", "Profile",
    "Project", "Scaling",
]
