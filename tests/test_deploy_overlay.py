"""The overlay deploy/README.md tells operators to write does what it says: their image replaces hostring's.

The README's YAML block is rendered as written (only its relative paths are pointed at this checkout) with the
offline renderer `tests/kustomize_lite.py`, which `tests/test_deploy.py` compares with `kubectl kustomize`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from tests import kustomize_lite

REPO = Path(__file__).resolve().parent.parent
K8S = REPO / "deploy" / "k8s"
README = REPO / "deploy" / "README.md"


def readme_overlay() -> dict[str, object]:
    """The kustomization in the README's `# my-overlay/kustomization.yaml` block."""
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    (block,) = [b for b in blocks if "my-overlay/kustomization.yaml" in b]
    data = yaml.safe_load(block)
    assert isinstance(data, dict)
    return data


def render(overlay: dict[str, object], tmp: Path) -> list[dict[str, object]]:
    """Render `overlay` as if it sat in my-overlay/ beside deploy/ (its ../deploy/k8s paths made relative to tmp)."""
    here = os.path.relpath(K8S, tmp)

    def point(path: str) -> str:
        return path.replace("../deploy/k8s", here)

    data = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", **overlay}
    data["resources"] = [point(p) for p in data.get("resources", [])]  # type: ignore[attr-defined]
    data["components"] = [point(p) for p in data.get("components", [])]  # type: ignore[attr-defined]
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    return kustomize_lite.build(tmp)


def hostring_images(objects: list[dict[str, object]]) -> set[str]:
    images = set()
    for obj in objects:
        for path in kustomize_lite.POD_TEMPLATE_PATHS.get(str(obj["kind"]), ()):
            template = kustomize_lite._dig(obj, path)
            if template is None:
                continue
            for container in template["spec"]["containers"]:
                if "redis" not in container["image"]:
                    images.add(container["image"])
    return images


def test_the_readme_overlay_replaces_the_image(tmp_path: Path) -> None:
    overlay = readme_overlay()
    (rule,) = overlay["images"]  # type: ignore[misc]
    want = f"{rule['newName']}:{rule['newTag']}"
    objects = render(overlay, tmp_path)
    assert hostring_images(objects) == {want}, "every hostring container runs the overlay's image"


def test_naming_the_manifests_placeholder_would_not_have_worked(tmp_path: Path) -> None:
    """What the README said before: `name: hostring`. The base already rewrote that name, so nothing matched and
    every pod kept the default image; this is the failure the README's overlay must not repeat."""
    overlay = readme_overlay()
    overlay["images"] = [{"name": "hostring", "newName": "registry.example.org/hostring", "newTag": "0.1.0"}]
    assert hostring_images(render(overlay, tmp_path)) == {"ghcr.io/hostring/hostring:0.1.0"}
