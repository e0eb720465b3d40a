"""hydratune: declarative, config-driven LLM fine-tuning.

Everything the wheel installs lives under this one namespace, so that another project's top-level
``recipes`` (torchtune ships one), ``conf`` or ``components`` never meets ours: the repository's
top-level ``components/``, ``recipes/`` and ``conf/`` install as :mod:`hydratune.components`,
:mod:`hydratune.recipes` and :mod:`hydratune.conf` (``pyproject.toml`` maps them). Run dirs written
before the namespace name ``components.*`` / ``recipes.*`` targets: ``components/config/legacy.py`` reads
them as today's.
"""

__version__ = "0.1.0"
