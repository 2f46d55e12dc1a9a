"""``python -m analysis.report``: see :func:`analysis.report.build.main`."""

from analysis.report.build import main

raise SystemExit(main())
