"""Imported once by a local process pool's fork server (engine `Stage.preload`) for the stages whose
workers find faces with dlib (faces, validate_edits): loads the 68-landmark model (~100 MB, about 1 s,
the slowest load of such a worker) and the HOG detector, so the forked workers share them
(copy-on-write) instead of each loading them again. No model runs here, so no thread pool exists yet
when the server forks."""

try:
    from biasaudit.faces.detect import _dlib_detector, shape_predictor

    shape_predictor()
    _dlib_detector("hog")
except Exception:
    pass
