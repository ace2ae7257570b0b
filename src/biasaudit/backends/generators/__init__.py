"""Text-to-image generator backends behind one interface (see base.py):

diffusers (any hub id / local pipeline folder), tiny (random-weight SD3/Flux, stand-in), imagen
(google-genai), openai (images endpoint, also OpenAI-compatible servers), folder (import existing
images), packaged-photos (stand-in: seeded variants of public-domain photos shipped in packages), planted
(PLANTED truth: recoloured packaged photos with declared labels and skin tones).
Each registers itself with `@register("generator", name)` (biasaudit/registry.py); their heavy
SDKs are imported inside the factories so that e.g. the API backends need no torch.
"""

from __future__ import annotations

from biasaudit.backends.generators.base import Generator, GenRequest, GenResult
from biasaudit.params.generate import GeneratorSpec


def make_generator(name: str, spec: GeneratorSpec, known_prompt_ids: set[str] | None = None,
                   tiny_root: str | None = None) -> Generator:
    """Instantiate the backend of `spec` (loads weights / opens clients)."""
    if spec.backend == "diffusers":
        from biasaudit.backends.generators.diffusers_backend import DiffusersGenerator

        return DiffusersGenerator(name, spec)
    if spec.backend == "tiny":
        from biasaudit.backends.generators.diffusers_backend import make_tiny

        return make_tiny(name, spec, tiny_root)
    if spec.backend == "imagen":
        from biasaudit.backends.generators.imagen import ImagenGenerator

        return ImagenGenerator(name, spec)
    if spec.backend == "openai":
        from biasaudit.backends.generators.openai_images import OpenAIImagesGenerator

        return OpenAIImagesGenerator(name, spec)
    if spec.backend == "folder":
        from biasaudit.backends.generators.folder import FolderGenerator

        return FolderGenerator(name, spec, known_prompt_ids)
    if spec.backend == "packaged-photos":
        from biasaudit.backends.generators.packaged_photos import PackagedPhotosGenerator

        return PackagedPhotosGenerator(name, spec)
    if spec.backend == "planted":
        from biasaudit.backends.generators.planted import PlantedGenerator

        return PlantedGenerator(name, spec)
    raise ValueError(f"backend: unknown generator backend '{spec.backend}'")


__all__ = ["GenRequest", "GenResult", "Generator", "GeneratorSpec", "make_generator"]
