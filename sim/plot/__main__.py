"""`python -m sim.plot`: simulate schedules, print a table, draw the figures (sim.plot.cli)."""
import sys

from sim.plot.cli import main

sys.exit(main())
