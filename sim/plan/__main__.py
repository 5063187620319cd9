"""`python -m sim.plan`: search the layouts of a run, print the best, draw them (sim.plan.cli)."""
import sys

from sim.plan.cli import main

sys.exit(main())
