from pulsartxn.cli import main

raise SystemExit(main())
