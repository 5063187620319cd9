"""`python -m exec`: the same command line as `python -m exec.run`."""
import sys

from exec.run import main

sys.exit(main())
