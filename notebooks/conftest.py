"""The chapters under nbval: `pytest --nbval-lax --nbval-current-env notebooks/` (what `make nbval` runs).

pytest reads this file for any run that collects this folder. It brings lab_utils/nbval_plugin.py's hooks: a
failed verdict cell is reported as the claims that changed, the sanitizers in nbval_sanitize.cfg apply by default,
and LAB_NBVAL_SAVE=DIR keeps each notebook as nbval executed it."""

from lab_utils.nbval_plugin import (  # noqa: F401 (pytest finds hooks by name in this module)
    pytest_configure,
    pytest_runtest_makereport,
    pytest_runtest_setup,
)
