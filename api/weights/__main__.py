"""`python -m api.weights`: see api/weights/cli.py."""

from api.weights.cli import main

raise SystemExit(main())
