"""What runs on a pilot's node: the agent and everything it starts.

- :mod:`.agent`: ``python -m parsl_bf.pilot.agent``, one per pilot job: registers with the
  executor, runs its launches, reports their exits.
- :mod:`.ranks`: the agent's warm ranks (relays and standbys) and the ranks of one launch.
- :mod:`.warmhost`: the warm host that forks plain apps, and the rank host that forks ranks.
- :mod:`.runner`: one plain app in a process of its own.
- :mod:`.relay`, :mod:`.standby`: the MPI jobs of one rank started ahead of need.
- :mod:`.gpus`: a node's GPUs.

The contracts the executor shares with it are :mod:`.wire` (the channel: messages, secrets,
sessions, the agent's module) and :mod:`.outcome` (the plain-app runner's command line and
outcome file): the driver imports those two modules of this package and nothing else. This
package imports nothing of the driver (:mod:`parsl_bf.executor`'s executor, channel server
and controller, :mod:`parsl_bf.allocation`, :mod:`parsl_bf.providers`), of Parsl's
DataFlowKernel, of Pyomo or of :mod:`parsl_bf.replay` (``tests/unit/test_light_imports.py``
checks). Nothing is imported here, so that ``import parsl_bf.pilot.wire`` costs that module.
"""
