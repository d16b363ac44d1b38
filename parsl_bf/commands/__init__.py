"""The ``parsl-bf`` subcommands that run workflows and look at runs, one module each.

- :mod:`.run`: ``parsl-bf run WORKFLOW --config CONFIG [workflow args]``
- :mod:`.status`: ``parsl-bf status [RUN_DIR]``
- :mod:`.progress`: the thread that watches a ``parsl-bf run`` (tasks, pilots, executor status)
"""
