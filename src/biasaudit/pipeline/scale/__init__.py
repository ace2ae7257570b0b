"""Running per-item stages at scale: the local process pool and the Ray runner."""
