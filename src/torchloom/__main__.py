"""`python -m torchloom COMMAND ...` is the `loom` command; `torchrun --nproc-per-node N -m
torchloom train CONFIG` runs it in each process torchrun starts."""

import sys

from torchloom.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
