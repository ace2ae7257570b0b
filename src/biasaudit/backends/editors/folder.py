"""Backend `folder`: no editor. The counterfactuals stage imports an existing FOCUS-layout dataset as
is (vlm/focus.py); this entry only describes what that import needs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from biasaudit.registry import register

if TYPE_CHECKING:  # the sections these functions read (tests/field_reads.py types each read by them)
    from biasaudit.params.vlm import Counterfactuals


@register("editor", "folder")
class FolderImport:
    name = "folder"
    imports_existing = True  # the edits exist already: no source photos are needed
    requires_all = ("folder_dir",)
    inputs = ("folder_dir",)  # fingerprinted by the check stage
    needs = (("input", "folder_dir", "put the FOCUS-layout images there"),)

    def __init__(self, spec: Counterfactuals):
        raise ValueError("backend 'folder' imports an existing FOCUS dataset; it has no editor (see vlm/focus.py)")
