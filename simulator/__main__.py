"""``python -m simulator`` is the ``ckptsim`` command."""

from simulator.cli import main

raise SystemExit(main())
