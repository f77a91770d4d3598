"""Reports: explain (pass-level visibility), metrics, the memory plan, the demo, the HTML report.

The package is also callable: `novaforge.report(model, *inputs, path=...)` writes the HTML
report (`html_report.report`). A module cannot be called, so this one's class is a
`ModuleType` subclass with `__call__`; `novaforge.report.explain` and the other submodules
import as usual. Importing the package is cheap (nothing heavy is imported until a call).
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, model: Any, *inputs: Any, **kwargs: Any) -> Any:
        from .html_report import report

        return report(model, *inputs, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
