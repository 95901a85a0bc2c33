"""A `jsonschema` validator for a CustomResourceDefinition's structural schema, as the API server checks a new object.

A CRD's `openAPIV3Schema` is OpenAPI 3.0's schema dialect (JSON Schema draft 4 keywords) plus
Kubernetes extensions that plain JSON Schema does not know, so each is translated here
(Kubernetes docs, "Extend the Kubernetes API with CustomResourceDefinitions"):

- Unknown fields: the API server prunes fields the schema does not name, and `kubectl apply`
  (`--validate=strict`, its default) refuses them instead. An object schema therefore gets
  `additionalProperties: false` unless it has its own `additionalProperties` (a map) or
  `x-kubernetes-preserve-unknown-fields: true`, which keeps any field below it.
- `x-kubernetes-int-or-string: true`: an integer or a string (the schema may carry the `anyOf`
  itself; it is added when it does not).
- `x-kubernetes-embedded-resource: true`: `apiVersion`, `kind` and `metadata` are allowed.
- `nullable: true`: null is allowed too.
- `x-kubernetes-list-type: set` / `map` with `x-kubernetes-list-map-keys`: items unique as a
  whole / by their keys (a key's `default` stands in for a missing key), which the API server
  enforces.
- `x-kubernetes-map-type` and `x-kubernetes-list-type: atomic`: merge strategies only, nothing to check.
- `x-kubernetes-validations` (CEL): a rule that reads `oldSelf` is a transition rule and only
  applies to an update, so it is skipped for a new object; any other rule is refused here so
  that a newer CRD with a rule this translation cannot check is noticed rather than passed.
- The root `metadata` is validated by the API server as ObjectMeta, not by the CRD schema.
- `format: int32/int64`: the integer fits the type.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import jsonschema
import yaml

INT_RANGES = {"int32": 2**31, "int64": 2**63}


def crd_validator(crd_path: Path, version: str) -> jsonschema.protocols.Validator:
    """The validator for `version` (e.g. "v1") of the CRD in `crd_path`."""
    crd = yaml.safe_load(crd_path.read_text())
    served = {v["name"]: v for v in crd["spec"]["versions"]}
    schema = structural_to_json_schema(served[version]["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: the API server's own check
    validator_class = jsonschema.validators.extend(jsonschema.Draft4Validator, {"x-kubernetes-list-type": _list_type})
    jsonschema.Draft4Validator.check_schema(schema)
    return validator_class(schema, format_checker=_format_checker())


def structural_to_json_schema(node: Any) -> Any:
    """A copy of a structural schema with the Kubernetes extensions written as JSON Schema keywords."""
    if isinstance(node, list):
        return [structural_to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: structural_to_json_schema(value) for key, value in node.items()}
    for rule in node.get("x-kubernetes-validations", []):
        if "oldSelf" not in rule["rule"]:
            raise NotImplementedError(f"CEL rule {rule['rule']!r} cannot be checked here")
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in node and "type" not in node:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("x-kubernetes-embedded-resource"):
        out.setdefault("properties", {})
        for field in ("apiVersion", "kind"):
            out["properties"].setdefault(field, {"type": "string"})
        out["properties"].setdefault("metadata", {"type": "object"})
    if node.get("type") == "object" and "additionalProperties" not in node \
            and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if node.get("nullable") and "type" in node:
        out["type"] = [node["type"], "null"]
    return out


def _list_type(validator, list_type: str, instance: Any, schema: dict) -> Iterator[jsonschema.ValidationError]:
    if not validator.is_type(instance, "array") or list_type == "atomic":
        return
    if list_type == "set":
        keyed = [(repr(item), item) for item in instance]
    elif list_type == "map":
        fields = schema.get("items", {}).get("properties", {})
        keys = schema["x-kubernetes-list-map-keys"]
        keyed = [(tuple(item.get(k, fields.get(k, {}).get("default")) for k in keys), item) for item in instance
                 if isinstance(item, dict)]
    else:
        yield jsonschema.ValidationError(f"unknown x-kubernetes-list-type {list_type!r}")
        return
    seen = set()
    for key, item in keyed:
        if key in seen:
            yield jsonschema.ValidationError(f"duplicate entry {key} in a list of type {list_type}: {item!r}")
        seen.add(key)


def _format_checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker()
    for name, bound in INT_RANGES.items():
        checker.checks(name)(lambda value, bound=bound: not isinstance(value, int) or -bound <= value < bound)
    return checker
