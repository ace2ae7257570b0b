"""Imported once by the local process pool's fork server (engine `Stage.preload`): loads what every
faces worker needs, so the forked workers share it (copy-on-write) instead of each loading it again.
No model runs here, so no thread pool exists yet when the server forks."""

try:
    import open_clip  # noqa: F401 - with torch: seconds to import

    from biasaudit.faces.detect import _dlib_detector, shape_predictor

    shape_predictor()  # the 68-landmark model: ~100 MB, the slowest load of a worker
    _dlib_detector("hog")
except Exception:  # noqa: BLE001 - a worker then loads what it needs itself (and reports any error)
    pass
