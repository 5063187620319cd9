from exec.run import main
import sys
sys.exit(main())
