"""A small, pure-Python kustomize: enough to render what `deploy/k8s` ships, with no binary and no network.

It implements the subset of https://kubectl.docs.kubernetes.io/references/kustomize/ that the base and its
components use, in kustomize's order (resources, then components, then patches, namespace, labels, images):

- ``resources``: YAML files (several documents each) and directories holding their own kustomization;
- ``components``: directories whose ``kind: Component`` kustomization adds resources and patches;
- ``patches``: strategic merge patches (maps merged, ``null`` deletes a key, lists of named items merged by
  ``name``, ``$patch: delete`` removes the whole object) and JSON 6902 patches (add, remove, replace), from
  ``path`` or inline ``patch``, with an optional ``target`` (group, version, kind, name, namespace);
- ``namespace``; ``labels`` (``pairs``, ``includeSelectors``, ``includeTemplates``); ``images``.

Anything else in a kustomization is refused with an error instead of being silently ignored, so a feature
added to the manifests later fails the tests here until this renderer (or a real kustomize) handles it.
`tests/test_deploy.py` checks that the output equals `kubectl kustomize` where that binary is installed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_FIELDS = {"apiVersion", "kind", "resources", "components", "patches", "namespace", "labels", "images"}

# Kinds that live outside namespaces (the ones a deployment like this could plausibly contain).
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "IngressClass",
    "RuntimeClass",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
}
# Where pod templates sit, per kind (for labels.includeTemplates and images).
POD_TEMPLATE_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {
    "Deployment": (("spec", "template"),),
    "StatefulSet": (("spec", "template"),),
    "DaemonSet": (("spec", "template"),),
    "ReplicaSet": (("spec", "template"),),
    "Job": (("spec", "template"),),
    "CronJob": (("spec", "jobTemplate"), ("spec", "jobTemplate", "spec", "template")),
}
# Strategic-merge lists whose items are matched by `name` rather than replaced wholesale.
NAMED_LISTS = {"containers", "initContainers", "ephemeralContainers", "env", "volumes", "imagePullSecrets"}


class KustomizeError(ValueError):
    pass


def build(directory: str | Path) -> list[Obj]:
    """Render the kustomization in `directory` into a list of Kubernetes objects."""
    return _build(Path(directory), expect_component=False, accumulated=[])


# --- loading -------------------------------------------------------------------------------------------------------


def _kustomization(directory: Path) -> Obj:
    for name in KUSTOMIZATION_FILES:
        path = directory / name
        if path.is_file():
            data = yaml.safe_load(path.read_text()) or {}
            if not isinstance(data, dict):
                raise KustomizeError(f"{path}: not a mapping")
            unknown = set(data) - SUPPORTED_FIELDS
            if unknown:
                raise KustomizeError(f"{path}: fields not supported by kustomize_lite: {sorted(unknown)}")
            return data
    raise KustomizeError(f"{directory}: no kustomization file")


def _load_documents(path: Path) -> list[Obj]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for d in docs:
        if not isinstance(d, dict) or "kind" not in d or "metadata" not in d:
            raise KustomizeError(f"{path}: every document must be a Kubernetes object")
    return docs


def _build(directory: Path, *, expect_component: bool, accumulated: list[Obj]) -> list[Obj]:
    k = _kustomization(directory)
    is_component = k.get("kind") == "Component"
    if is_component != expect_component:
        raise KustomizeError(
            f"{directory}: kind {k.get('kind')!r} used as a {'component' if expect_component else 'resource'}"
        )

    objects = accumulated
    for entry in k.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            objects.extend(_build(target, expect_component=False, accumulated=[]))
        elif target.is_file():
            objects.extend(_load_documents(target))
        else:
            raise KustomizeError(f"{directory}: resource {entry!r} not found")
    for entry in k.get("components", []):
        objects = _build((directory / entry).resolve(), expect_component=True, accumulated=objects)

    for patch in k.get("patches", []):
        objects = _apply_patch(directory, patch, objects)
    if "namespace" in k:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = k["namespace"]
    for entry in k.get("labels", []):
        _apply_labels(objects, entry)
    for image in k.get("images", []):
        _apply_image(objects, image)
    return objects


# --- patches -------------------------------------------------------------------------------------------------------


def _matches(obj: Obj, target: Obj) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    wanted = {
        "group": group,
        "version": version,
        "kind": obj["kind"],
        "name": obj["metadata"].get("name"),
        "namespace": obj["metadata"].get("namespace"),
    }
    unsupported = set(target) - set(wanted)
    if unsupported:
        raise KustomizeError(f"patch target selectors not supported: {sorted(unsupported)}")
    return all(wanted[key] == value for key, value in target.items())


def _apply_patch(directory: Path, patch: Obj, objects: list[Obj]) -> list[Obj]:
    if "path" in patch:
        text = (directory / patch["path"]).read_text()
    elif "patch" in patch:
        text = patch["patch"]
    else:
        raise KustomizeError(f"{directory}: a patch needs `path` or `patch`")
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    target = patch.get("target")

    if len(docs) == 1 and isinstance(docs[0], list):  # JSON 6902: a list of operations
        if target is None:
            raise KustomizeError(f"{directory}: a JSON 6902 patch needs a target")
        hits = [obj for obj in objects if _matches(obj, target)]
        if not hits:
            raise KustomizeError(f"{directory}: patch target {target} matches nothing")
        for obj in hits:
            _json6902(obj, docs[0])
        return objects

    result = objects
    for doc in docs:
        selector = target or {"kind": doc["kind"], "name": doc["metadata"]["name"]}
        hits = [obj for obj in result if _matches(obj, selector)]
        if not hits:
            raise KustomizeError(f"{directory}: patch for {selector} matches nothing")
        if doc.get("$patch") == "delete":
            result = [obj for obj in result if not any(obj is hit for hit in hits)]
            continue
        body = {key: value for key, value in doc.items() if key not in ("apiVersion", "kind")}
        body["metadata"] = {key: value for key, value in doc["metadata"].items() if key not in ("name", "namespace")}
        for obj in hits:
            _strategic_merge(obj, body)
    return result


def _strategic_merge(base: Obj, patch: Obj) -> None:
    for key, value in patch.items():
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            _strategic_merge(base[key], value)
        elif key in NAMED_LISTS and isinstance(value, list) and isinstance(base.get(key), list):
            # Like kustomize: the patch's items come first (merged into their namesakes), then the rest.
            by_name = {item["name"]: item for item in base[key]}
            merged = []
            for item in value:
                if item["name"] in by_name:
                    _strategic_merge(by_name[item["name"]], item)
                    merged.append(by_name[item["name"]])
                else:
                    merged.append(copy.deepcopy(item))
            named = {item["name"] for item in value}
            base[key] = merged + [item for item in base[key] if item["name"] not in named]
        else:
            base[key] = copy.deepcopy(value)


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise KustomizeError(f"JSON pointer {path!r} must start with /")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _json6902(obj: Obj, operations: list[Obj]) -> None:
    for op in operations:
        *parents, last = _pointer(op["path"])
        node: Any = obj
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        kind = op["op"]
        if kind == "add":
            if isinstance(node, list):
                if last == "-":
                    node.append(copy.deepcopy(op["value"]))
                else:
                    node.insert(int(last), copy.deepcopy(op["value"]))
            else:
                node[last] = copy.deepcopy(op["value"])
        elif kind == "replace":
            index: Any = int(last) if isinstance(node, list) else last
            if isinstance(node, dict) and last not in node:
                raise KustomizeError(f"replace: {op['path']} does not exist")
            node[index] = copy.deepcopy(op["value"])
        elif kind == "remove":
            if isinstance(node, list):
                del node[int(last)]
            elif last in node:
                del node[last]
            else:
                raise KustomizeError(f"remove: {op['path']} does not exist")
        else:
            raise KustomizeError(f"JSON 6902 op {kind!r} not supported by kustomize_lite")


# --- labels and images ---------------------------------------------------------------------------------------------


def _set_labels(holder: Obj, pairs: dict[str, str]) -> None:
    holder.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)


def _dig(obj: Obj, path: tuple[str, ...]) -> Obj | None:
    node: Any = obj
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, dict) else None


def _apply_labels(objects: list[Obj], entry: Obj) -> None:
    if entry.get("includeSelectors"):
        raise KustomizeError("labels.includeSelectors is not supported by kustomize_lite (and selectors are immutable)")
    pairs = {str(k): str(v) for k, v in entry["pairs"].items()}
    for obj in objects:
        _set_labels(obj, pairs)
        if not entry.get("includeTemplates"):
            continue
        for path in POD_TEMPLATE_PATHS.get(obj["kind"], ()):
            template = _dig(obj, path)
            if template is not None:
                _set_labels(template, pairs)
        if obj["kind"] == "StatefulSet":
            for claim in obj["spec"].get("volumeClaimTemplates", []):
                _set_labels(claim, pairs)


def _split_image(image: str) -> tuple[str, str]:
    """('registry/name', ':tag' or '@digest' or '')."""
    if "@" in image:
        name, digest = image.split("@", 1)
        return name, "@" + digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon:]
    return image, ""


def _apply_image(objects: list[Obj], rule: Obj) -> None:
    for obj in objects:
        for path in POD_TEMPLATE_PATHS.get(obj["kind"], ()):
            spec = _dig(obj, (*path, "spec"))
            if spec is None:
                continue
            for field in ("containers", "initContainers"):
                for container in spec.get(field, []):
                    name, suffix = _split_image(container["image"])
                    if name != rule["name"]:
                        continue
                    if "digest" in rule:
                        suffix = "@" + rule["digest"]
                    elif "newTag" in rule:
                        suffix = ":" + str(rule["newTag"])
                    container["image"] = rule.get("newName", name) + suffix
