"""``python -m analysis.predict``: see :func:`analysis.predict.cli.main`."""

from analysis.predict.cli import main

raise SystemExit(main())
