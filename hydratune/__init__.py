"""hydratune: declarative, config-driven LLM fine-tuning.

Everything the wheel installs lives under this one namespace, so that another project's top-level
``recipes`` (torchtune ships one), ``conf`` or ``components`` never meets ours: the repository's
top-level ``components/``, ``recipes/`` and ``conf/`` install as :mod:`hydratune.components`,
:mod:`hydratune.recipes` and :mod:`hydratune.conf` (``pyproject.toml`` maps them). Run from a source
checkout that is not installed (a second worktree, ``PYTHONPATH=<checkout>``), the same names are that
checkout's folders. Run dirs written before the namespace name ``components.*`` / ``recipes.*`` targets:
``components/config/legacy.py`` reads them as today's.
"""

from pathlib import Path

__version__ = "0.1.0"

_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "components" / "recipe.py").is_file():
    # a source checkout: hydratune.components / .recipes / .conf are its top-level folders (an installed
    # wheel has them inside this folder, and no pyproject.toml beside it)
    __path__.append(str(_checkout))
