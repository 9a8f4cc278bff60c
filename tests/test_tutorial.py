"""The tutorial's code, as written in docs/tutorial.md, run against the real control plane."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from resourceconsist import lifecycle
from resourceconsist.testing import LocalControlPlane, finalizers

TUTORIAL = Path(__file__).resolve().parent.parent / "docs" / "tutorial.md"


def tutorial_namespace() -> dict[str, Any]:
    blocks = re.findall(r"```python\n(.*?)```", TUTORIAL.read_text(), re.S)
    assert len(blocks) >= 5, "the tutorial lost its code blocks"
    namespace: dict[str, Any] = {"__name__": "tutorial"}
    exec(compile("\n".join(blocks), str(TUTORIAL), "exec"), namespace)
    return namespace


async def test_the_tutorial_adapter_converges(
    control_plane: LocalControlPlane, namespace: str, tmp_path: Path
) -> None:
    tutorial = tutorial_namespace()
    result = await tutorial["tutorial_scenario"](control_plane, tmp_path / "backends", namespace)
    assert result["file_left"] is None, "the backends file must be gone with its Service"
    assert lifecycle.lifecycle_finalizer("web") not in finalizers(result["pod"])
