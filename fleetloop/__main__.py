import sys

from fleetloop.cli import main

sys.exit(main())
