import sys

from mtserve.cli import main

sys.exit(main())
