"""verifiers environments (``verifiers==0.4.*``, the ``verifiers`` extra) as a dataset that plays itself: the
environment's taskset gives the rows, its harness plays each row through a session of the run's gateway (so its
trajectories are token-exact, as any agent's), and its task's rewards and judges are the reward
(docs/environments.md).

``config.py`` is the ``dataset: {verifiers: ...}`` section; ``environment.py`` loads the environment (what is refused,
by name) and makes its rows; ``offline.py`` keeps verifiers' harness programs off the network; ``player.py`` plays a
row as a gateway session and tells the environment's failures from the model's.

Nothing is imported here: the rollout config imports ``config.py`` on every run, and ``player.py`` needs the
gateway's extra (an install without it must still answer ``agentloop --help``).
"""
