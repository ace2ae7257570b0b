"""Image editors for face-only counterfactuals (Method B), behind one interface (editors/base.py).

    editor = make_editor(cfg.counterfactuals)        # gemini | openai | diffusers | tiny
    results = editor.edit([EditRequest(source, 'Black_man', 'a Black man', instruction, seed, mask)])

Backend `folder` runs no editor: vlm/focus.py imports an existing FOCUS-layout dataset as is.
"""

from __future__ import annotations

from typing import Any

from biasaudit.backends.editors.base import EditRequest, EditResult, ImageEditor, composite, feathered_alpha

EDITORS = ("gemini", "openai", "diffusers", "tiny")


def make_editor(spec: Any) -> ImageEditor:
    """Build the editor a `Counterfactuals` section names (imports only what it needs)."""
    if spec.backend == "gemini":
        from biasaudit.backends.editors.hosted import GeminiEditor
        return GeminiEditor(spec)
    if spec.backend == "openai":
        from biasaudit.backends.editors.hosted import OpenAIEditor
        return OpenAIEditor(spec)
    if spec.backend == "diffusers":
        from biasaudit.backends.editors.diffusers_inpaint import DiffusersInpaintEditor
        return DiffusersInpaintEditor(spec)
    if spec.backend == "tiny":
        from biasaudit.backends.editors.tiny import TinyEditor
        return TinyEditor(spec.model_id, spec.mask_dilate_px, spec.mask_feather_px)
    if spec.backend == "folder":
        raise ValueError("backend 'folder' imports an existing FOCUS dataset; it has no editor (see vlm/focus.py)")
    raise ValueError(f"counterfactuals.backend: unknown editor '{spec.backend}'; available: {', '.join(EDITORS)}, folder")


__all__ = ["EDITORS", "EditRequest", "EditResult", "ImageEditor", "composite", "feathered_alpha", "make_editor"]
