import sys

from clamor.cli import main

sys.exit(main())
