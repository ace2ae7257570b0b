"""biasaudit: reproducible audits of image generators and VLMs for racial and skin-tone disparities."""

__version__ = "0.1.0"

# The label sets live in biasaudit.contracts (with paths, columns and L* bins); re-exported here.
from biasaudit.contracts import GROUPS, STAND_IN, UNKNOWN  # noqa: F401
