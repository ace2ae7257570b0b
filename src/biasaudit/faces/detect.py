"""Face detection backends: dlib (HOG or CNN, real models shipped in packages) and insightface (buffalo_l).

Every detector returns a list of `Face` (largest first). 68-point landmarks come from dlib's shape
predictor on the detected box, whatever the detector, so the landmark skin mask works for both.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np


@dataclass
class Face:
    bbox: tuple[float, float, float, float]  # x0, y0, x1, y1 in pixels
    score: float  # detector confidence (insightface: probability; dlib HOG: SVM margin; CNN: confidence)
    kps: np.ndarray | None = None  # 5 keypoints (insightface)
    embedding: np.ndarray | None = None  # insightface ArcFace normed embedding when computed
    extra: dict = field(default_factory=dict)

    @property
    def area(self) -> float:
        x0, y0, x1, y1 = self.bbox
        return max(0.0, x1 - x0) * max(0.0, y1 - y0)


def order_faces(faces: list[Face], tie: float = 0.8) -> list[Face]:
    """Largest face first. Boxes whose area is within `tie` of the largest count as equally large
    (dlib's HOG boxes come in discrete pyramid sizes) and among them the highest score wins, so a
    same-size false positive (e.g. a badge) does not displace a real face. Not a score threshold:
    a threshold would drop dark faces first (their HOG scores are lower)."""
    if not faces:
        return []
    biggest = max(f.area for f in faces)
    main = max((f for f in faces if f.area >= tie * biggest), key=lambda f: (f.score, f.area))
    rest = sorted((f for f in faces if f is not main), key=lambda f: (f.area, f.score), reverse=True)
    return [main, *rest]


def dlib_model_path(name: str) -> Path:
    """Path of a model file shipped in `face-recognition-models`, found without importing the package
    (its __init__ needs pkg_resources, which recent setuptools no longer ships)."""
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the dlib model files need `pip install face-recognition-models`")
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / name
    if not path.is_file():
        raise RuntimeError(f"missing dlib model file {path}")
    return path


@lru_cache(maxsize=4)
def _dlib_detector(kind: str):
    import dlib

    if kind == "hog":
        return dlib.get_frontal_face_detector()
    return dlib.cnn_face_detection_model_v1(str(dlib_model_path("mmod_human_face_detector.dat")))


@lru_cache(maxsize=1)
def shape_predictor():
    import dlib

    return dlib.shape_predictor(str(dlib_model_path("shape_predictor_68_face_landmarks.dat")))


def landmarks68(rgb: np.ndarray, bbox: tuple[float, float, float, float]) -> np.ndarray:
    """68 (x, y) landmarks (iBUG layout) inside a face box, from dlib's packaged shape predictor."""
    import dlib

    x0, y0, x1, y1 = (int(round(v)) for v in bbox)
    shape = shape_predictor()(np.ascontiguousarray(rgb), dlib.rectangle(x0, y0, x1, y1))
    return np.array([(p.x, p.y) for p in shape.parts()], dtype=np.float64)


class DlibDetector:
    """dlib HOG (fast, frontal) or CNN (MMOD, more robust, slower) face detector."""

    def __init__(self, kind: str = "hog", upsample: int = 1, threshold: float = 0.0):
        if kind not in ("hog", "cnn"):
            raise ValueError(f"dlib detector kind must be 'hog' or 'cnn', got {kind!r}")
        self.kind, self.upsample, self.threshold = kind, upsample, threshold
        self.name = f"dlib-{kind}"
        self.model_id = "dlib.get_frontal_face_detector" if kind == "hog" else "mmod_human_face_detector.dat"
        import dlib

        self.revision = dlib.__version__
        self.stand_in = False

    def detect(self, rgb: np.ndarray) -> list[Face]:
        img = np.ascontiguousarray(rgb)
        det = _dlib_detector(self.kind)
        if self.kind == "hog":
            rects, scores, _ = det.run(img, self.upsample, self.threshold)
            faces = [Face((r.left(), r.top(), r.right(), r.bottom()), float(s)) for r, s in zip(rects, scores)]
        else:
            faces = [Face((m.rect.left(), m.rect.top(), m.rect.right(), m.rect.bottom()), float(m.confidence))
                     for m in det(img, self.upsample) if m.confidence >= self.threshold]
        h, w = img.shape[:2]
        faces = [Face((max(0.0, f.bbox[0]), max(0.0, f.bbox[1]), min(float(w), f.bbox[2]), min(float(h), f.bbox[3])),
                      f.score) for f in faces]
        return order_faces(faces)


def onnx_providers(device: str = "auto") -> tuple[list, int]:
    """(onnxruntime providers, insightface ctx_id) for `device` (auto | cpu | cuda | cuda:N): CUDA when
    onnxruntime has its CUDA provider (onnxruntime-gpu) and the device allows it, else the CPU. With CUDA,
    `onnxruntime.preload_dlls()` (onnxruntime >= 1.21) first loads the CUDA 12 / cuDNN 9 libraries of
    torch's nvidia-* wheels, which onnxruntime-gpu does not bring (requirements-gpu.lock), once per
    process: through insightface's own once-only guard where it has one (insightface >= 2.1 preloads
    before its first CUDA session), else directly (older insightface never calls it)."""
    import onnxruntime as ort

    want_cuda = device == "auto" or device.startswith("cuda")
    if want_cuda and "CUDAExecutionProvider" in ort.get_available_providers():
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
        try:
            from insightface.model_zoo.onnxruntime_utils import preload_cuda_libraries
        except ImportError:
            preload_cuda_libraries = None
        try:
            if preload_cuda_libraries is not None:
                preload_cuda_libraries(providers)
            elif getattr(ort, "preload_dlls", None) is not None:
                ort.preload_dlls()
        except OSError:  # libraries not found: the sessions fall back to the CPU, and `device` says so
            pass
        return providers, index
    return ["CPUExecutionProvider"], -1


def insightface_pack_dir(name: str, root: str | None) -> Path:
    """Where FaceAnalysis looks for pack `name`; a FileNotFoundError naming the fix when it is absent
    (insightface would otherwise download it at run time)."""
    base = Path(root or "~/.insightface").expanduser()
    pack = base / "models" / name
    if not pack.is_dir() or not any(pack.glob("*.onnx")):
        raise FileNotFoundError(
            f"InsightFace pack '{name}' not found at {pack} (faces.insightface_root = '{root or ''}'); "
            f"run `biasaudit weights fetch --only insightface-{name}` (it goes to models/insightface) and set "
            "faces.insightface_root: models/insightface — nothing is downloaded at run time")
    return pack


class InsightFaceDetector:
    """insightface FaceAnalysis (SCRFD detector + ArcFace recogniser), e.g. buffalo_l under `root`/models/.
    Only faces with det_score > threshold are kept (the paper: > 0.85). Runs on CUDA when onnxruntime
    has the CUDA provider and `device` allows it (ctx_id = the CUDA device index), else on the CPU;
    `self.device` records where its ONNX sessions actually run (cuda:N | cpu)."""

    def __init__(self, name: str = "buffalo_l", root: str | None = None, threshold: float = 0.85,
                 det_size: int = 640, with_embedding: bool = True, stand_in: bool = False, device: str = "auto"):
        from insightface.app import FaceAnalysis

        insightface_pack_dir(name, root)
        modules = ["detection", "recognition"] if with_embedding else ["detection"]
        kwargs = {"root": root} if root else {}
        providers, ctx_id = onnx_providers(device)
        self.app = FaceAnalysis(name=name, allowed_modules=modules, providers=providers, **kwargs)
        self.app.prepare(ctx_id=ctx_id, det_thresh=threshold, det_size=(det_size, det_size))
        self.threshold = threshold
        # where the ONNX sessions actually run (onnxruntime falls back to the CPU when the CUDA provider
        # cannot load), not what was asked for: cuda:N only when a session runs CUDAExecutionProvider
        self.device = "cpu"
        for model in self.app.models.values():
            session = getattr(model, "session", None)
            if session is not None and "CUDAExecutionProvider" in session.get_providers():
                options = session.get_provider_options().get("CUDAExecutionProvider", {})
                self.device = f"cuda:{options.get('device_id', max(ctx_id, 0))}"
                break
        self.name, self.model_id, self.stand_in = "insightface", name, stand_in
        import insightface

        self.revision = insightface.__version__

    def detect(self, rgb: np.ndarray) -> list[Face]:
        bgr = np.ascontiguousarray(rgb[..., ::-1])
        h, w = rgb.shape[:2]
        out = []
        for f in self.app.get(bgr):
            if float(f.det_score) <= self.threshold:  # strictly above, as the paper states (> 0.85)
                continue
            emb = getattr(f, "normed_embedding", None) if getattr(f, "embedding", None) is not None else None
            x0, y0, x1, y1 = (float(v) for v in f.bbox)
            box = (min(max(0.0, x0), w), min(max(0.0, y0), h), min(max(0.0, x1), w), min(max(0.0, y1), h))
            if box[2] - box[0] < 2 or box[3] - box[1] < 2:
                continue
            out.append(Face(box, float(f.det_score), kps=np.asarray(f.kps),
                            embedding=None if emb is None else np.asarray(emb, dtype=np.float32)))
        return order_faces(out)


def make_detector(backend: str, **kw):
    if backend == "dlib":
        return DlibDetector(kind=kw.get("dlib_kind", "hog"), upsample=kw.get("dlib_upsample", 1),
                            threshold=kw.get("dlib_threshold", 0.0))
    if backend == "insightface":
        return InsightFaceDetector(name=kw.get("insightface_model", "buffalo_l"), root=kw.get("insightface_root") or None,
                                   threshold=kw.get("det_threshold", 0.85), det_size=kw.get("det_size", 640),
                                   stand_in=kw.get("stand_in", False), device=kw.get("device", "auto"))
    raise ValueError(f"unknown face detector backend {backend!r} (dlib | insightface)")
