"""``python -m qlint``: the same command as the ``qlint`` script."""

from qlint.cli import main

if __name__ == "__main__":
    main(prog_name="qlint")
