"""``python -m launchers.doctor``: see :func:`launchers.doctor.check.main`."""

from launchers.doctor.check import main

raise SystemExit(main())
