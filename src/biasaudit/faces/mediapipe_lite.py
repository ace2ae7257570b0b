"""MediaPipe's BlazeFace (short range) detector and 468-point face mesh, run with the LiteRT interpreter.

The `.tflite` models ship inside the `mediapipe` 0.10.x wheels. The `mediapipe` package itself cannot be
installed beside this project (0.10.21 pins protobuf < 5; onnx needs ≥ 6.31), so `ensure_models` takes
only the two model files out of the wheel (`pip download --no-deps mediapipe==0.10.21`, read as a zip)
into `models/mediapipe/`, and `ai-edge-litert` (Google's LiteRT runtime, the TFLite interpreter without
TensorFlow or mediapipe) runs them. Pre- and post-processing follow MediaPipe's graphs: BlazeFace on a
128² letterboxed input in [-1, 1] with its 896 SSD anchors (strides 8, 16), sigmoid scores ≥ 0.5 and
non-maximum suppression; the mesh on a 192² square crop of the face box enlarged 1.5× (no rotation:
the faces here are upright), values in [0, 1].
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from biasaudit.faces.detect import Face, order_faces

MEDIAPIPE_WHEEL = "mediapipe==0.10.21"
FILES = {"face_detection_short_range.tflite": "mediapipe/modules/face_detection/face_detection_short_range.tflite",
         "face_landmark.tflite": "mediapipe/modules/face_landmark/face_landmark.tflite"}

# Face-mesh index sets (MediaPipe's FACEMESH_* connections): face oval, eyes, brows, lips.
FACE_OVAL = [10, 338, 297, 332, 284, 251, 389, 356, 454, 323, 361, 288, 397, 365, 379, 378, 400, 377, 152, 148,
             176, 149, 150, 136, 172, 58, 132, 93, 234, 127, 162, 21, 54, 103, 67, 109]
LEFT_EYE = [263, 249, 390, 373, 374, 380, 381, 382, 362, 398, 384, 385, 386, 387, 388, 466]
RIGHT_EYE = [33, 7, 163, 144, 145, 153, 154, 155, 133, 173, 157, 158, 159, 160, 161, 246]
LEFT_BROW = [276, 283, 282, 295, 285, 300, 293, 334, 296, 336]
RIGHT_BROW = [46, 53, 52, 65, 55, 70, 63, 105, 66, 107]
LIPS = [61, 146, 91, 181, 84, 17, 314, 405, 321, 375, 291, 409, 270, 269, 267, 0, 37, 39, 40, 185]


def ensure_models(directory: str | Path, download: bool = False) -> tuple[dict[str, Path] | None, str]:
    """(paths of the two .tflite files, '') or (None, reason). With `download` (the setup step, never a
    stage: stages run offline), missing files are read out of the mediapipe wheel fetched with pip
    (no install, no dependencies)."""
    directory = Path(directory)
    paths = {name: directory / name for name in FILES}
    if all(p.is_file() for p in paths.values()):
        return paths, ""
    if not download:
        return None, (f"{directory}/ lacks {', '.join(sorted(FILES))}: run `make setup` (or "
                      f"python -m biasaudit.faces.mediapipe_lite {directory}) to extract them from {MEDIAPIPE_WHEEL}")
    try:
        import ai_edge_litert  # noqa: F401
    except ImportError:
        return None, "ai-edge-litert is not installed (pip install ai-edge-litert==2.3.0)"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", MEDIAPIPE_WHEEL, "-d", tmp]
        try:
            subprocess.run(cmd, check=True, capture_output=True, timeout=600)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            return None, f"could not download the {MEDIAPIPE_WHEEL} wheel for its .tflite files: " + \
                (detail.decode(errors="replace").strip().splitlines() or [type(exc).__name__])[-1][:300]
        wheels = list(Path(tmp).glob("mediapipe-*.whl"))
        if not wheels:
            return None, f"pip download of {MEDIAPIPE_WHEEL} gave no wheel"
        directory.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as zf:
            for name, member in FILES.items():
                paths[name].write_bytes(zf.read(member))
    return paths, ""


def model_revision(paths: dict[str, Path]) -> str:
    return "; ".join(f"{n} sha256:{hashlib.sha256(p.read_bytes()).hexdigest()[:12]}" for n, p in sorted(paths.items()))


def _interpreter(path: Path):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    # without the default XNNPACK delegate: creating it prints an INFO line from C++ that pool workers interleave
    # differently in every run, so the executed notebook (a tracked output) hashed differently in every clone
    it = Interpreter(model_path=str(path), num_threads=1,
                     experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    it.allocate_tensors()
    return it


def blazeface_anchors() -> np.ndarray:
    """The 896 (x, y) anchor centres of the short-range model: 16×16×2 (stride 8), 8×8×6 (stride 16)."""
    out = []
    for grid, per in ((16, 2), (8, 6)):
        ys, xs = np.meshgrid((np.arange(grid) + 0.5) / grid, (np.arange(grid) + 0.5) / grid, indexing="ij")
        out.append(np.repeat(np.stack([xs.ravel(), ys.ravel()], axis=1), per, axis=0))
    return np.concatenate(out)


def _nms(boxes: np.ndarray, scores: np.ndarray, iou: float = 0.3) -> list[int]:
    order, keep = list(np.argsort(-scores)), []
    while order:
        i = order.pop(0)
        keep.append(i)
        rest = []
        for j in order:
            ix = max(0.0, min(boxes[i, 2], boxes[j, 2]) - max(boxes[i, 0], boxes[j, 0]))
            iy = max(0.0, min(boxes[i, 3], boxes[j, 3]) - max(boxes[i, 1], boxes[j, 1]))
            inter = ix * iy
            a = (boxes[i, 2] - boxes[i, 0]) * (boxes[i, 3] - boxes[i, 1])
            b = (boxes[j, 2] - boxes[j, 0]) * (boxes[j, 3] - boxes[j, 1])
            if inter / max(a + b - inter, 1e-9) < iou:
                rest.append(j)
        order = rest
    return keep


class BlazeFaceDetector:
    """MediaPipe BlazeFace short-range (faces within ~2 m, i.e. portraits) through LiteRT."""

    def __init__(self, paths: dict[str, Path], threshold: float = 0.5):
        self.it = _interpreter(paths["face_detection_short_range.tflite"])
        self.anchors = blazeface_anchors()
        self.threshold = threshold
        self.name, self.model_id = "mediapipe-blazeface", "face_detection_short_range.tflite (mediapipe 0.10.21)"
        self.revision, self.stand_in = model_revision(paths), False

    def detect(self, rgb: np.ndarray) -> list[Face]:
        import cv2

        h, w = rgb.shape[:2]
        side = max(h, w)
        pad = np.zeros((side, side, 3), np.uint8)
        pad[:h, :w] = rgb
        x = cv2.resize(pad, (128, 128), interpolation=cv2.INTER_AREA).astype(np.float32) / 127.5 - 1.0
        inp, (reg, cls) = self.it.get_input_details()[0], self.it.get_output_details()
        self.it.set_tensor(inp["index"], x[None])
        self.it.invoke()
        raw = self.it.get_tensor(reg["index"])[0]
        logits = np.clip(self.it.get_tensor(cls["index"])[0, :, 0].astype(np.float64), -100, 100)
        scores = 1.0 / (1.0 + np.exp(-logits))
        keep = scores >= self.threshold
        if not keep.any():
            return []
        r, a, s = raw[keep], self.anchors[keep], scores[keep]
        cx, cy = r[:, 0] / 128 + a[:, 0], r[:, 1] / 128 + a[:, 1]
        bw, bh = r[:, 2] / 128, r[:, 3] / 128
        boxes = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], axis=1) * side
        faces = [Face((max(0.0, b[0]), max(0.0, b[1]), min(float(w), b[2]), min(float(h), b[3])), float(sc))
                 for b, sc in ((boxes[i], s[i]) for i in _nms(boxes, s))]
        return order_faces(faces)


class FaceMesh:
    """MediaPipe's 468-point face mesh on a face box (LiteRT)."""

    def __init__(self, paths: dict[str, Path]):
        self.it = _interpreter(paths["face_landmark.tflite"])
        self.name, self.model_id = "mediapipe-facemesh", "face_landmark.tflite (mediapipe 0.10.21)"

    def landmarks(self, rgb: np.ndarray, box) -> tuple[np.ndarray, float]:
        """(468×2 landmark pixels, face presence score) for the face in `box`."""
        import cv2

        x0, y0, x1, y1 = box
        cx, cy, half = (x0 + x1) / 2, (y0 + y1) / 2, 0.75 * max(x1 - x0, y1 - y0)
        src = np.float32([[cx - half, cy - half], [cx + half, cy - half], [cx - half, cy + half]])
        dst = np.float32([[0, 0], [192, 0], [0, 192]])
        crop = cv2.warpAffine(rgb, cv2.getAffineTransform(src, dst), (192, 192), borderMode=cv2.BORDER_CONSTANT)
        inp = self.it.get_input_details()[0]
        self.it.set_tensor(inp["index"], (crop.astype(np.float32) / 255.0)[None])
        self.it.invoke()
        outs = {tuple(d["shape"]): d["index"] for d in self.it.get_output_details()}
        pts = self.it.get_tensor(outs[(1, 1, 1, 1404)]).reshape(468, 3)[:, :2]
        flag = float(1.0 / (1.0 + np.exp(-self.it.get_tensor(outs[(1, 1, 1, 1)]).ravel()[0])))
        return np.column_stack([cx - half + pts[:, 0] * (2 * half / 192), cy - half + pts[:, 1] * (2 * half / 192)]), flag


def mesh_skin_mask(shape: tuple[int, int], pts: np.ndarray) -> np.ndarray:
    """Face oval (hull) minus eyes, brows and lips (hulls, slightly dilated)."""
    import cv2

    face = np.zeros(shape, np.uint8)
    cv2.fillPoly(face, [cv2.convexHull(np.round(pts[FACE_OVAL]).astype(np.int32))], 1)
    holes = np.zeros(shape, np.uint8)
    for part in (LEFT_EYE, RIGHT_EYE, LEFT_BROW, RIGHT_BROW, LIPS):
        cv2.fillPoly(holes, [cv2.convexHull(np.round(pts[part]).astype(np.int32))], 1)
    width = float(np.ptp(pts[FACE_OVAL, 0])) or 1.0
    pad = max(1, int(round(0.02 * width)))
    holes = cv2.dilate(holes, np.ones((2 * pad + 1, 2 * pad + 1), np.uint8))
    return face.astype(bool) & ~holes.astype(bool)


if __name__ == "__main__":  # the setup step: python -m biasaudit.faces.mediapipe_lite [DIR]
    target = sys.argv[1] if len(sys.argv) > 1 else "models/mediapipe"
    found, why = ensure_models(target, download=True)
    print(f"mediapipe models in {target}" if found else f"warning: no mediapipe models ({why}); the "
          "instruments stage will record MediaPipe as not run")
