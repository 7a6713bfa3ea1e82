"""AsyncOmni embedded in a script: without an ``if __name__ == "__main__":`` guard the
engines cannot start (the fork server re-imports the script in each child); the error
says so and how to fix it, and the guarded script works."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

BODY = textwrap.dedent("""\
    import asyncio
    import logging

    from omni import AsyncOmni


    async def main():
        async with AsyncOmni("echo", log_level=logging.WARNING) as omni:
            async for out in omni.generate({"prompt": "hi"}):
                if out.data:
                    print("OUTPUT", out.data["text"])

    """)


def _run(tmp_path, text: str) -> subprocess.CompletedProcess:
    script = tmp_path / "my_app.py"
    script.write_text(text)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.timeout(180)
def test_an_unguarded_script_is_told_how_to_fix_it(tmp_path):
    out = _run(tmp_path, BODY + "asyncio.run(main())\n")
    assert out.returncode != 0
    assert "StartupError" in out.stderr
    assert 'put that code under `if __name__ == "__main__":`' in out.stderr, out.stderr[-2000:]
    assert "my_app.py" in out.stderr


@pytest.mark.timeout(180)
def test_the_guarded_script_runs(tmp_path):
    out = _run(tmp_path, BODY + 'if __name__ == "__main__":\n    asyncio.run(main())\n')
    assert out.returncode == 0, out.stderr[-2000:]
    assert "OUTPUT hi" in out.stdout
