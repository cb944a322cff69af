"""``python -m evtfuse.cli``: the ``evtfuse`` command (``profile`` runs ``run`` this way).

Layer: cli.
"""

from . import main

main()
