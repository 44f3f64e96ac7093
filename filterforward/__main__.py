import sys

from filterforward.cli import main

sys.exit(main())
