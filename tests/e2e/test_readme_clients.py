"""The README's first programs in Python (async and sync), run as written against a real
server: each prints the turn's tool calls with their results, then its text.

(The TypeScript one runs in `clients/ts/test/readme.test.mjs`.)
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

from tests.e2e.conftest import E2E
from tests.processes import REPO

EXPECTED = ['word_count({"text": "count these words please"}) -> 4 words', "Tool results: 4 words"]


def clients_section() -> str:
    readme = (REPO / "README.md").read_text()
    return readme.split("\n## Clients\n", 1)[1].split("\n## ", 1)[0]


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", clients_section(), re.DOTALL)


async def run_program(source: str, address: str, path: Path) -> list[str]:
    await asyncio.to_thread(path.write_text, source.replace("127.0.0.1:50051", address))
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(path), cwd=path.parent,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, _ = await process.communicate()
    assert process.returncode == 0, out.decode()
    return out.decode().splitlines()


async def test_the_readme_shows_what_the_programs_print() -> None:
    section = clients_section()
    assert "```text\n" + "\n".join(EXPECTED) + "\n```" in section


async def test_the_python_programs_of_the_readme_print_the_turn(e2e: E2E, tmp_path: Path) -> None:
    programs = blocks("python")
    assert len(programs) == 2, "the async and the sync program"
    assert "connect_sync" in programs[1] and "async def" in programs[0]
    for number, program in enumerate(programs):
        printed = await run_program(program, e2e.target, tmp_path / f"program{number}.py")
        assert printed == EXPECTED, program
