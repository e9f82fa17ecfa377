from inceptionn.cli import main

raise SystemExit(main())
