import sys

from parity_tests.cli import main

sys.exit(main())
