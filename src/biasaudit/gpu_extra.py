"""Whether this machine's onnxruntime can use its GPU (InsightFace's ONNX sessions).

`biasaudit check` prints `onnxruntime_warning()` when a GPU is present but the installed onnxruntime is
the CPU build (no CUDAExecutionProvider): InsightFace would then run on the CPU. The fix is the GPU extra,
`make setup-gpu` (requirements-gpu.lock: onnxruntime-gpu in place of onnxruntime).
"""

from __future__ import annotations

import shutil
from pathlib import Path

CUDA_PROVIDER = "CUDAExecutionProvider"
FIX = "make setup-gpu (onnxruntime-gpu from requirements-gpu.lock in place of onnxruntime)"


def gpu_present() -> bool:
    """An NVIDIA GPU with its driver loaded (without importing torch or CUDA)."""
    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidia0").exists() or \
        shutil.which("nvidia-smi") is not None


def onnx_providers() -> list[str] | None:
    """The installed onnxruntime's execution providers (None: onnxruntime is not installed)."""
    try:
        import onnxruntime
    except ImportError:
        return None
    return list(onnxruntime.get_available_providers())


def onnxruntime_warning(gpu: bool | None = None, providers: list[str] | None = None) -> str:
    """'' when fine; else one warning line (a GPU here, and onnxruntime without its CUDA provider)."""
    gpu = gpu_present() if gpu is None else gpu
    if not gpu:
        return ""
    providers = onnx_providers() if providers is None else providers
    if providers is None or CUDA_PROVIDER in providers:
        return ""
    return (f"warning: a GPU is present but onnxruntime has no {CUDA_PROVIDER} (providers: "
            f"{', '.join(providers) or 'none'}): InsightFace will run on the CPU; fix: {FIX}")
