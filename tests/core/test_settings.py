"""docs/config.md, the one table of this package's config fields, against the fields themselves: a field added,
removed or given another default without the table fails here."""

import ast
import re
from dataclasses import MISSING, fields
from pathlib import Path

from trl_zerostd.core.settings import ZeroStdArguments

ROW = re.compile(r"^\| `(\w+)` \| `([^`]*)` \|")


def test_config_table_lists_every_field_with_its_default():
    text = (Path(__file__).resolve().parents[2] / "docs" / "config.md").read_text()
    rows = [ROW.match(line) for line in text.splitlines()]
    table = {row[1]: ast.literal_eval(row[2]) for row in rows if row}
    defaults = {f.name: f.default for f in fields(ZeroStdArguments) if f.default is not MISSING}
    assert table == defaults
