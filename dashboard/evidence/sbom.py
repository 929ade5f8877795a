"""A CycloneDX SBOM (JSON, spec 1.6) of the Python distributions installed in this
environment, with who requires whom, built with cyclonedx-python-lib from
``importlib.metadata``."""

from __future__ import annotations

import importlib.metadata
import json
import re
from typing import Any

from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL
from packaging.requirements import InvalidRequirement, Requirement

APP_DISTRIBUTION = "orbitpilot-dashboard"


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distributions() -> dict[str, importlib.metadata.Distribution]:
    found: dict[str, importlib.metadata.Distribution] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(_normalised(name), dist)
    return found


def _requires(dist: importlib.metadata.Distribution) -> set[str]:
    """The distributions it needs in this environment (extras' needs left out)."""
    needed = set()
    for line in dist.requires or ():
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            needed.add(_normalised(requirement.name))
    return needed


def app_version() -> str:
    try:
        return importlib.metadata.version(APP_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_sbom() -> dict[str, Any]:
    """The SBOM as a JSON object (the library's own serialisation, parsed back)."""
    dists = _distributions()
    bom = Bom()
    root = Component(name=APP_DISTRIBUTION, version=app_version(),
                     type=ComponentType.APPLICATION, bom_ref=f"app:{APP_DISTRIBUTION}")
    bom.metadata.component = root
    components: dict[str, Component] = {}
    for key in sorted(dists):
        if key == APP_DISTRIBUTION:
            continue
        dist = dists[key]
        purl = PackageURL(type="pypi", name=key, version=dist.version)
        components[key] = Component(name=dist.metadata["Name"], version=dist.version,
                                    type=ComponentType.LIBRARY, purl=purl,
                                    bom_ref=purl.to_string())
        bom.components.add(components[key])
    app = dists.get(APP_DISTRIBUTION)
    direct = _requires(app) if app is not None else set(components)
    bom.register_dependency(root, [components[k] for k in sorted(direct) if k in components])
    for key, component in components.items():
        bom.register_dependency(component, [components[k] for k in sorted(_requires(dists[key]))
                                            if k in components and k != key])
    return json.loads(JsonV1Dot6(bom).output_as_string())
