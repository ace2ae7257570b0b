"""biasaudit: reproducible audits of image generators and VLMs for racial and skin-tone disparities."""

__version__ = "0.1.0"

# Method A groups, in the canonical column order used by every table.
GROUPS: tuple[str, ...] = ("white", "black", "asian", "hispanic", "other")
UNKNOWN = "unknown"

# Label written into every output produced by a random-weight stand-in model.
STAND_IN = "stand-in"
