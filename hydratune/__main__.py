"""``python -m hydratune`` is the ``hydratune`` command."""

from hydratune.recipes.cli import main

if __name__ == "__main__":
    main()
