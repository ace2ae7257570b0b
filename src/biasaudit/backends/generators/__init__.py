"""Text-to-image generator backends behind one interface (see base.py):

diffusers (any hub id / local pipeline folder), tiny (random-weight SD3/Flux, stand-in), imagen
(google-genai, Vertex :predict; Imagen is retired), gemini-image (Gemini image models through
generate_content), openai (images endpoint, also OpenAI-compatible servers), folder (import existing
images), packaged-photos (stand-in: seeded variants of public-domain photos shipped in packages), planted
(PLANTED truth: recoloured packaged photos with declared labels and skin tones).
Each registers itself with `@register("generator", name)` (biasaudit/registry.py); their heavy
SDKs are imported inside the factories so that e.g. the API backends need no torch.
"""

from __future__ import annotations

from biasaudit import registry
from biasaudit.backends.generators.base import Generator, GenRequest, GenResult
from biasaudit.params.generate import GeneratorSpec


def make_generator(name: str, spec: GeneratorSpec, known_prompt_ids: set[str] | None = None,
                   tiny_root: str | None = None, groups: tuple[str, ...] = (),
                   genders: tuple[str, ...] = ()) -> Generator:
    """Instantiate the backend of `spec` (loads weights / opens clients): the factory registered under its
    name, given the optional arguments its signature takes (`known_prompt_ids`: folder; `tiny_root`: tiny;
    `groups`, the active group set's labels, and `genders`, the gender set's: planted)."""
    if spec.backend not in registry.names("generator"):
        raise ValueError(f"backend: unknown generator backend '{spec.backend}'; available: "
                         f"{', '.join(registry.names('generator'))}")
    return registry.build("generator", spec.backend, name, spec, known_prompt_ids=known_prompt_ids,
                          tiny_root=tiny_root, groups=groups, genders=genders)


def probe(model: str, spec: GeneratorSpec) -> str:
    """A hosted generator's one request before its stage's first batch ('' when the model is served)."""
    gen = make_generator(model, spec)
    try:
        return gen.probe()
    finally:
        gen.close()


def stage_probe(model: str, spec: GeneratorSpec):
    """The engine's Stage.probe of generate@<model>: None for a local backend (loading it is the check)."""
    from functools import partial

    return partial(probe, model, spec) if registry.is_hosted("generator", spec.backend) else None


__all__ = ["GenRequest", "GenResult", "Generator", "GeneratorSpec", "make_generator", "probe", "stage_probe"]
