import sys

from lab_utils.cli import main

sys.exit(main())
