"""Backend `folder`: no editor. The counterfactuals stage imports an existing FOCUS-layout dataset as
is (vlm/focus.py); this entry only describes what that import needs."""

from __future__ import annotations

from typing import Any

from biasaudit.registry import register


@register("editor", "folder")
class FolderImport:
    name = "folder"
    imports_existing = True  # the edits exist already: no source photos are needed
    requires_all = ("folder_dir",)
    inputs = ("folder_dir",)  # fingerprinted by the check stage
    needs = (("input", "folder_dir", "put the FOCUS-layout images there"),)

    def __init__(self, spec: Any):
        raise ValueError("backend 'folder' imports an existing FOCUS dataset; it has no editor (see vlm/focus.py)")
