"""Image editors for face-only counterfactuals (Method B), behind one interface (editors/base.py).

    editor = make_editor(cfg.counterfactuals)        # gemini | openai | diffusers | tiny
    results = editor.edit([EditRequest(source, 'Black_man', 'a Black man', instruction, seed, mask)])

Editors register with `@register("editor", name)` (biasaudit/registry.py). Backend `folder` runs no
editor: vlm/focus.py imports an existing FOCUS-layout dataset as is.
"""

from __future__ import annotations

from typing import Any

from biasaudit import registry
from biasaudit.backends.editors.base import EditRequest, EditResult, ImageEditor, composite, feathered_alpha


def make_editor(spec: Any) -> ImageEditor:
    """Build the editor a `Counterfactuals` section names (imports only what it needs)."""
    if spec.backend not in registry.names("editor"):
        raise ValueError(f"counterfactuals.backend: unknown editor '{spec.backend}'; available: "
                         f"{', '.join(registry.names('editor'))}")
    return registry.build("editor", spec.backend, spec)


def stage_probe(spec: Any):
    """The counterfactuals stage's Stage.probe: a hosted editor's one request before the first batch
    ('' when its model is served); None for a local editor."""
    from functools import partial

    return partial(_probe, spec) if registry.is_hosted("editor", spec.backend) else None


def _probe(spec: Any) -> str:
    return make_editor(spec).probe()


__all__ = ["EditRequest", "EditResult", "ImageEditor", "composite", "feathered_alpha", "make_editor", "stage_probe"]
