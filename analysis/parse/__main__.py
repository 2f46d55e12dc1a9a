"""``python -m analysis.parse``: see :func:`analysis.parse.reader.main`."""

from analysis.parse.reader import main

raise SystemExit(main())
