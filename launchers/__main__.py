"""``python -m launchers``: see ``launchers.cli``."""

from launchers.cli import main

raise SystemExit(main())
