"""The pipeline's plumbing: the engine every per-item stage runs on and what keeps a run safe (crash-safe
writes, outputs kept on failure, the profile stash, processes that end with their parent, progress lines,
provenance, secrets kept out of outputs). The science lives beside it: t2i/, vlm/, stats/, faces/."""
