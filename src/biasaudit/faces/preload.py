"""Imported once by the local process pool's fork server for the faces stage (engine `Stage.preload`):
torch and open_clip (seconds to import) and the dlib models (faces.preload_dlib), so the forked
workers share them (copy-on-write) instead of each loading them again."""

try:
    import open_clip  # noqa: F401

    import biasaudit.faces.preload_dlib  # noqa: F401
except Exception:
    pass
