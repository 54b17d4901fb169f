"""Experiment trackers for rollouts and training: TensorBoard, Weights & Biases and MLflow behind one small
interface (``Tracker``), opened from a config's ``report_to`` and ``trackers`` section by ``open_trackers``.

One module per tracker; each imports its package only when opened, so an uninstalled tracker costs nothing.
Training logs through TRL's own integrations instead (``agentloop_grpc.train``), with our rollout metrics added
to its logs.
"""

from .base import SampleRow, Tracker
from .config import TrackerName, TrackerSettings, check_report_to, resolve_report_to
from .open_trackers import TrackerError, Trackers, flatten, open_trackers

__all__ = ["SampleRow", "Tracker", "TrackerError", "TrackerName", "TrackerSettings", "Trackers", "check_report_to",
           "flatten", "open_trackers", "resolve_report_to"]
