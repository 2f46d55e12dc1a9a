"""``python -m launchers.lab``: see :func:`launchers.lab.cli.main`."""

from launchers.lab.cli import main

raise SystemExit(main())
