"""The READMEs' Python examples, run as written (the repository's README and
this binding's), in a scratch directory holding the files they name
(``data.f64``, ``data.bin``), with the Redis URL they use
pointed at a server of the test's own. An example that no longer runs fails
here, not in a reader's hands."""

import os
import pathlib
import re

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
READMES = [ROOT / "README.md", ROOT / "crates" / "faultline-py" / "README.md"]


def python_blocks(path):
    text = path.read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def examples():
    out = []
    for path in READMES:
        for i, code in enumerate(python_blocks(path)):
            out.append(pytest.param(code, id=f"{path.relative_to(ROOT)}#{i}"))
    return out


def test_the_readmes_have_python_examples():
    assert len(examples()) >= 2


@pytest.mark.parametrize("code", examples())
def test_readme_example_runs(code, scratch, request, monkeypatch):
    (scratch / "data.f64").write_bytes(np.arange(1 << 18, dtype=np.float64).tobytes())
    (scratch / "data.bin").write_bytes(bytes(4 << 20))
    if "redis://127.0.0.1:6379/" in code:
        url = request.getfixturevalue("redis_url")
        code = code.replace("redis://127.0.0.1:6379/", url)
    monkeypatch.chdir(scratch)
    scope = {"__name__": "__readme__"}
    exec(compile(code, "README example", "exec"), scope)
    # Close what the example left open (its views first), in this test.
    for v in list(scope.values()):
        close = getattr(v, "close", None)
        if type(v).__module__.startswith("faultline") and callable(close):
            try:
                close()
            except Exception:
                pass
    scope.clear()
