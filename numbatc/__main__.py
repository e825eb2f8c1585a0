import sys

if sys.argv[1:2] == ["precompile"]:  # python -m numbatc precompile --shapes ...
    from numbatc.precompile import main

    sys.exit(main(sys.argv[2:]))

from numbatc.demo import main

sys.exit(main())
