"""`python -m flopwise` is the same as the `flopwise` console script."""

from flopwise.cli import main

if __name__ == "__main__":
    main()
