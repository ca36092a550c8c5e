import sys

from maxtext_netdata.cli import main

if __name__ == "__main__":
  sys.exit(main())
