import sys

from megatron_mtp.cli import main

if __name__ == "__main__":
    sys.exit(main())
