import sys

from edgesched.cli import main

sys.exit(main())
