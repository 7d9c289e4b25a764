"""``python -m harness.chaos`` (run by ``make chaos``): see :mod:`harness.chaos.cli`."""

from harness.chaos.cli import app

if __name__ == "__main__":
    app()
