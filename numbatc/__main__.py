import sys

from numbatc.demo import main

sys.exit(main())
