"""Parameters of the `faces@<model>` stage: face detection, skin mask, CIELAB, embeddings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from biasaudit import contracts as C
from biasaudit.params.base import Section


class Faces(Section):
    # Detector: dlib (real HOG/CNN models shipped in packages; offline default) or insightface (paper).
    detector: Literal["dlib", "insightface"] = "dlib"
    dlib_kind: Literal["hog", "cnn"] = "hog"
    dlib_upsample: int = Field(1, ge=0, le=3)  # upsample the image n times before HOG (finds smaller faces)
    # dlib detection score floor (HOG SVM margin / CNN confidence); 0.0 is dlib's default. Raising it drops
    # dark faces first: the astronaut's face scores 1.16, but 0.12 when darkened to L* ≈ 14 on a light background.
    dlib_threshold: float = Field(0.0, ge=-1.0, le=3.0)
    insightface_model: str = "buffalo_l"  # pack name under insightface_root/models/
    insightface_root: str = ""  # '' = insightface's default (~/.insightface); 'tiny' = random ONNX stand-in
    det_threshold: float = Field(0.85, ge=0.0, le=1.0)  # insightface: keep det_score > this (paper: > 0.85)
    det_size: int = Field(640, ge=128)  # insightface detector input side
    # Instrument check on every image: a second packaged detector (the share of faces one finds and the
    # other misses, by label and L* bin, in the analysis). "none" turns it off.
    cross_detector: Literal["none", "dlib-hog", "dlib-cnn"] = "none"
    cross_upsample: int = Field(0, ge=0, le=3)
    # Pixel budget: an image whose longer side exceeds this is decoded small and resized to it before
    # detection and skin parsing, which bounds a worker's memory for any input (an 8000×8000 photo
    # exhausts 8 GB in dlib's detectors at full size; at 1024 px the worker peaks near 2 GB, see
    # docs/architecture.md); each row records the scale (`image_scale`, 1.0 = as stored).
    image_max_side: int = Field(1024, ge=64)
    measure_multi_face: bool = True  # several faces: measure the largest (True) or record 'multi_face' (False)
    # Skin mask: 68-landmark polygon minus eyes/brows/mouth/nostrils, or BiSeNet (CelebAMask-HQ skin class).
    skin_method: Literal["landmarks", "bisenet"] = "landmarks"
    bisenet_weights: str = "models/bisenet/79999_iter.pth"
    bisenet_margin: float = Field(0.5, ge=0.0, le=2.0)  # crop around the face box, fraction of its size per side
    min_skin_pixels: int = Field(50, ge=1)
    # L* percentiles kept inside the mask (0 / 100 = keep all, as in the paper).
    shadow_percentile: float = Field(0.0, ge=0.0, le=50.0)
    highlight_percentile: float = Field(100.0, ge=50.0, le=100.0)
    # Embeddings: face (largest face above threshold) and whole-image CLIP.
    face_embedding: Literal["dlib", "insightface", "none"] = "dlib"
    clip_model: str = "ViT-H-14"
    clip_pretrained: str = "laion2b_s32b_b79k"  # open_clip tag, local checkpoint path, or 'tiny' (stand-in)
    clip_batch_size: int = Field(16, ge=1)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    batch_size: int = Field(8, ge=1)  # images per resumable batch
    n_overlays: int = Field(6, ge=0)  # seeded sample of mask-outline overlays per model
    limit: int = Field(0, ge=0)  # process at most this many pending images (0 = all)

    @model_validator(mode="after")
    def _check(self) -> "Faces":
        if self.shadow_percentile >= self.highlight_percentile:
            raise ValueError("shadow_percentile must be below highlight_percentile")
        if self.face_embedding == "insightface" and self.detector != "insightface":
            raise ValueError("face_embedding 'insightface' needs detector 'insightface' (ArcFace runs on its detections)")
        return self


class Baseline(Section):
    """Real-portrait baseline of the homogeneity gap (beyond the paper): the same faces measurement on
    a folder `<portraits_dir>/<group>/*.jpg` of real people, so model gaps can be read relative to it."""

    # none: skip (the analysis says so) | folder: your portraits | packaged: STAND-IN built from the
    # packaged photos dealt into group folders at random (offline profile; exercises the code only)
    source: Literal["none", "folder", "packaged"] = "none"
    portraits_dir: str = C.PORTRAITS_DIR.as_posix()
    standin_per_group: int = Field(4, ge=2)  # packaged stand-in portraits per group
    n_boot: int = Field(200, ge=0)  # bootstrap resamples of portraits for the gap CIs
    n_permutations: int = Field(200, ge=0)


class Instruments(Section):
    """The `instruments` stage: detector and skin-mask behaviour over an L* sweep of the packaged photos."""

    L_min: float = Field(15.0, ge=0.0, le=100.0)
    L_max: float = Field(75.0, ge=0.0, le=100.0)
    L_step: float = Field(5.0, gt=0.0)
    recolourings: int = Field(4, ge=1, le=100)  # seeded photo/crop/flip/hue per L* (the same at every L*)
    modes: list[Literal["skin", "whole"]] = Field(default_factory=lambda: ["skin", "whole"])
    size: int = Field(160, ge=64, le=1024)  # output side (the planted models' size)
    crop_factor: float = Field(2.0, ge=1.3, le=6.0)
    hog_upsample: int = Field(1, ge=0, le=3)
    cnn_upsample: int = Field(0, ge=0, le=3)
    score_thresholds: list[float] = Field(default_factory=lambda: [0.0, 0.5])  # detection rates if scores were cut here
    dark_max: float = Field(25.0, ge=0.0, le=100.0)  # "dark" rows of the headline table: target L* ≤ this
    mediapipe: bool = True  # BlazeFace + 468-point mesh via LiteRT when their .tflite files are in models/mediapipe
    mediapipe_dir: str = "models/mediapipe"

    @model_validator(mode="after")
    def _check(self) -> "Instruments":
        if self.L_min >= self.L_max:
            raise ValueError("L_min must be below L_max")
        return self
