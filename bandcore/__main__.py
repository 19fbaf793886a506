"""``python -m bandcore [command] ...``: the ``bandcore`` command line."""

from bandcore.cli import main

raise SystemExit(main())
