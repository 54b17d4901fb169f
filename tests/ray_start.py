"""Start a local Ray for a test, with one more try when the node does not come up in time.

Ray gives its raylet a hard-coded 30 s to register with the GCS; on a loaded two-core CI machine the session's
first start once took longer ("The current node timed out during startup") while every later start took seconds.
A second try after ``ray.shutdown()`` is what a person would do; a second failure is reported as it is.
"""

from __future__ import annotations

import ray

_STARTUP_TIMEOUT = "The current node timed out during startup"


def init_ray(**kwargs) -> bool:
    """``ray.init(**kwargs)`` unless Ray is running; return whether this call started it."""
    if ray.is_initialized():
        return False
    try:
        ray.init(**kwargs)
    except Exception as error:
        if _STARTUP_TIMEOUT not in str(error):
            raise
        ray.shutdown()
        ray.init(**kwargs)
    return True
