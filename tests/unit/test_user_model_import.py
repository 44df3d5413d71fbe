"""A model file that imports a module beside it: `file.py:Class` imports that one file, so
`from layers import Block` fails; the message says what to put on PYTHONPATH."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.errors import UnknownModelError
from pipeline.zoo.user_class import import_class

NET = """from torch import nn
from {module} import Block


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
"""


def test_a_module_beside_the_file_gets_the_pythonpath_hint(tmp_path: Path) -> None:
    (tmp_path / "layers.py").write_text("from torch import nn\nBlock = nn.Identity\n")
    (tmp_path / "net.py").write_text(NET.format(module="layers"))
    with pytest.raises(UnknownModelError) as err:
        import_class(f"{tmp_path / 'net.py'}:Net")
    message = str(err.value)
    assert "No module named 'layers'" in message
    assert f"{tmp_path / 'layers.py'} is beside it" in message
    assert f"PYTHONPATH={tmp_path}" in message


def test_a_missing_module_elsewhere_keeps_the_plain_message(tmp_path: Path) -> None:
    (tmp_path / "net.py").write_text(NET.format(module="nowhere_to_be_found"))
    with pytest.raises(UnknownModelError, match=r"No module named .*Fix the file and retry\.$"):
        import_class(f"{tmp_path / 'net.py'}:Net")
