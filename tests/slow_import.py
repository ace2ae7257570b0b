"""A module that takes long to import, as torch does: a fork server preloading it is busy in its imports
(and not watching its "alive" pipe) for BIASAUDIT_TEST_IMPORT_SECONDS. Marks the start in the busy folder."""

import os
import time
from pathlib import Path

Path(os.environ["BIASAUDIT_TEST_BUSY_DIR"], str(os.getpid())).touch()
time.sleep(float(os.environ.get("BIASAUDIT_TEST_IMPORT_SECONDS", "60")))
