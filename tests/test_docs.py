"""The docs are executable: every shell command and every Python block of README.md and
docs/*.md runs, page by page, top to bottom, as a reader would run them.

How a page runs:

- Fenced blocks tagged ``bash`` are shell commands (one per line; a trailing backslash
  continues a line; ``#`` lines are comments); blocks tagged ``python`` are programs. An
  untagged block is a diagram or a wire dump and must not start like a command (a test
  says so).
- Each page runs in its own empty folder (``runs/...`` land there), with the venv's
  ``bin`` first on PATH, ``$SIMKIT_MAX_TOTAL_STEPS`` capping every training run (a few
  updates each; :data:`MAX_TOTAL_STEPS`), ``$SIMKIT_MAIN_LOGDIR`` and
  ``$MINARI_DATASETS_PATH`` inside that folder, and every loopback port the page names
  (``127.0.0.1:5555``, ``--metrics-port 9100``) replaced by a free one, the same one
  everywhere on the page. ``./run ...`` runs from the repository root. ``MUJOCO_GL=X``
  names the OpenGL backend that works on the machine (osmesa, else egl).
- A Python block runs in a fresh interpreter, in the page's folder.

An HTML comment right before a block (invisible on the rendered page) changes that:

- ``<!-- doc-test: skip REASON -->``: the block does not run; the reason says why (a
  cluster, a GPU, minutes of benchmark, a fragment of a class shown above).
- ``<!-- doc-test: skip-lines "TEXT": REASON -->``: the block's commands containing TEXT
  do not run (a server that runs until stopped, a Ray cluster's address).
- ``<!-- doc-test: background -->``: the block's commands are servers: they start in the
  background, run while the rest of the page runs, and are stopped at its end.
- ``<!-- doc-test: continues -->``: the Python block continues the page's previous one
  (they run as one program, where the last of them stands).
- ``<!-- doc-test: wait-for PORT -->``: before the next blocks run, wait until something
  listens on PORT (a background server; the page's port, replaced as above).

Pages whose commands train, record or launch servers are marked ``docs_slow``:
``./run test`` runs them, CI (``.ci/run``) leaves them out to keep its suite within 10
minutes on 2 cores; the other pages run in seconds, everywhere.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_TOTAL_STEPS = 256
"""Every documented run trains at most this many env steps, in updates that fit it
(:func:`simkit.clients.learners._args.capped`): seconds per run."""
COMMAND_TIMEOUT = 240.0
SLOW_WORDS = ("simkit train", "simkit eval", "./run main", "simkit record", "simkit.train(")

FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
COMMAND_START = re.compile(
    r"^(\$ )?(simkit [a-z-]+(\s|$)|python |\.venv/|\./run |ray |tensorboard |pip )"
)


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    markers: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page.name
        return f"{page}:{self.line}"

    def marker(self, name: str) -> list[str]:
        """The arguments of this block's markers called ``name``."""
        out = []
        for m in self.markers:
            head, _, rest = m.partition(" ")
            if head == name:
                out.append(rest.strip())
        return out


def blocks_of(page: Path) -> list[Block]:
    """Every fenced block of ``page``, with the doc-test markers right before it."""
    lines = page.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.groups()
        j = i + 1
        while not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        markers = []
        k = i - 1
        while k >= 0 and MARKER.match(lines[k]):
            markers.insert(0, MARKER.match(lines[k]).group(1))  # type: ignore[union-attr]
            k -= 1
        body = [
            line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : j]
        ]
        out.append(Block(page, i + 1, lang, "\n".join(body), markers))
        i = j + 1
    return out


def commands_of(block: Block) -> list[str]:
    """The shell commands of a bash block: continuation lines joined, comments dropped."""
    commands: list[str] = []
    current = ""
    for raw in block.text.splitlines():
        line = raw.rstrip()
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        commands.append((current + line).strip())
        current = ""
    if current:
        commands.append(current.strip())
    return commands


def _skip_reason(block: Block) -> str | None:
    reasons = block.marker("skip")
    return reasons[0] if reasons else None


def _skipped_lines(block: Block) -> list[tuple[str, str]]:
    out = []
    for arg in block.marker("skip-lines"):
        m = re.fullmatch(r'"(.+?)":\s*(.+)', arg)
        if m is None:
            raise ValueError(f"{block.where}: skip-lines wants '\"TEXT\": REASON', got {arg!r}")
        out.append((m.group(1), m.group(2)))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ports(texts: list[str]) -> dict[str, str]:
    """Each loopback port or metrics port the page names, mapped to a free one."""
    found: set[str] = set()
    for text in texts:
        found.update(re.findall(r"127\.0\.0\.1:(\d{4,5})", text))
        found.update(re.findall(r"--metrics-port (\d{4,5})", text))
        found.update(re.findall(r"doc-test: wait-for (\d{4,5})", text))
    return {port: str(_free_port()) for port in sorted(found)}


def _with_ports(text: str, ports: dict[str, str]) -> str:
    for old, new in ports.items():
        text = re.sub(rf"(?<=127\.0\.0\.1:){old}\b", new, text)
        text = re.sub(rf"(?<=--metrics-port ){old}\b", new, text)
    return text


def _gl_backend() -> str | None:
    """The OpenGL backend MuJoCo renders with here: software first (osmesa, as CI
    installs), then EGL; None if neither works."""
    from simkit._mujoco import _backend_works

    return next((b for b in ("osmesa", "egl") if _backend_works(b)), None)


def _with_gl(command: str) -> str:
    """``MUJOCO_GL=X`` in a command becomes the backend that works on this machine."""
    if "MUJOCO_GL=" not in command:
        return command
    backend = _gl_backend()
    return command if backend is None else re.sub(r"MUJOCO_GL=\w+", f"MUJOCO_GL={backend}", command)


def _env(cwd: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["SIMKIT_MAX_TOTAL_STEPS"] = str(MAX_TOTAL_STEPS)
    env["SIMKIT_MAIN_LOGDIR"] = str(cwd / "runs" / "main")
    env["MINARI_DATASETS_PATH"] = str(cwd / "minari")
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stops a background command and everything it started (its own process group)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_for(port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.2)
    return False


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, bytes] | None:
    """Runs ``argv`` in its own process group; ``(exit status, stderr + stdout)``, or None
    after :data:`COMMAND_TIMEOUT` (the group, servers it started included, is killed)."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=COMMAND_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None
    return proc.returncode, err + out


def _tail(out: bytes) -> str:
    return "\n".join(out.decode(errors="replace").strip().splitlines()[-12:])


def run_page(page: Path, cwd: Path) -> list[str]:
    """Runs ``page`` top to bottom in ``cwd``; returns a failure message per failed
    command or block (all of them, not only the first)."""
    blocks = blocks_of(page)
    ports = _ports([page.read_text()])
    env = _env(cwd)
    for name in (".venv", "bench"):
        (cwd / name).symlink_to(ROOT / name)
    failures: list[str] = []
    background: list[subprocess.Popen[bytes]] = []
    pending: list[str] = []  # python code of blocks continued by a later block
    try:
        for block in blocks:
            if block.lang not in ("bash", "python") or _skip_reason(block) is not None:
                continue
            if block.lang == "python":
                code = "\n".join([*pending, _with_ports(block.text, ports)])
                pending = []
                if _continued(block, blocks):
                    pending = [code]
                    continue
                ran = _run([sys.executable, "-c", code], cwd, env)
                if ran is None:
                    failures.append(f"{block.where} python block: still running after timeout")
                elif ran[0] != 0:
                    failures.append(f"{block.where} python block: exit {ran[0]}\n{_tail(ran[1])}")
                continue
            skipped = _skipped_lines(block)
            for command in commands_of(block):
                if any(text in command for text, _ in skipped):
                    continue
                command = _with_gl(_with_ports(command, ports))
                here = ROOT if command.startswith(("./run ", "SIMKIT_MAIN_LOGDIR")) else cwd
                if block.marker("background"):
                    with open(cwd / f"background-{len(background)}.log", "wb") as log:
                        background.append(
                            subprocess.Popen(
                                ["bash", "-c", command],
                                cwd=here,
                                env=env,
                                stdout=log,
                                stderr=subprocess.STDOUT,
                                start_new_session=True,
                            )
                        )
                    continue
                ran = _run(["bash", "-c", command], here, env)
                if ran is None:
                    failures.append(
                        f"{block.where} `{command}`: still running after {COMMAND_TIMEOUT:.0f} s"
                    )
                elif ran[0] != 0:
                    failures.append(f"{block.where} `{command}`: exit {ran[0]}\n{_tail(ran[1])}")
            for port in block.marker("wait-for"):
                real = int(ports.get(port, port))
                if not _wait_for(real, time.monotonic() + 60):
                    failures.append(f"{block.where}: nothing listens on {port} after 60 s")
    finally:
        for proc in background:
            _stop(proc)
    return failures


def _continued(block: Block, blocks: list[Block]) -> bool:
    """Whether the page's next Python block continues ``block``."""
    after = [
        b
        for b in blocks[blocks.index(block) + 1 :]
        if b.lang == "python" and _skip_reason(b) is None
    ]
    return bool(after) and "continues" in after[0].markers


def _is_slow(page: Path) -> bool:
    text = page.read_text()
    return any(word in text for word in SLOW_WORDS) or "doc-test: background" in text


def _page_params() -> list[object]:
    params: list[object] = []
    for page in PAGES:
        runnable = [
            b for b in blocks_of(page) if b.lang in ("bash", "python") and _skip_reason(b) is None
        ]
        if not runnable:
            continue
        marks = [pytest.mark.docs_slow] if _is_slow(page) else []
        params.append(pytest.param(page, id=str(page.relative_to(ROOT)), marks=marks))
    return params


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("page", _page_params())
def test_every_command_and_example_of_the_page_runs(page: Path, tmp_path: Path) -> None:
    failures = run_page(page, tmp_path)
    assert not failures, "\n\n".join(failures)


def test_every_block_is_tagged_and_every_marker_is_known() -> None:
    """An untagged block that holds commands would escape the test; a misspelled marker
    would silently run (or skip) a block."""
    problems = []
    known = {"skip", "skip-lines", "background", "continues", "wait-for"}
    for page in PAGES:
        for block in blocks_of(page):
            first = next((ln for ln in block.text.splitlines() if ln.strip()), "")
            if block.lang == "" and COMMAND_START.match(first.strip()):
                problems.append(f"{block.where}: untagged block of commands (tag it ```bash)")
            for m in block.markers:
                if m.split(" ")[0] not in known:
                    problems.append(f"{block.where}: unknown doc-test marker {m!r}")
            if "skip" in [m.split(" ")[0] for m in block.markers] and not _skip_reason(block):
                problems.append(f"{block.where}: a skip marker says why")
            try:
                _skipped_lines(block)
            except ValueError as exc:
                problems.append(str(exc))
    assert not problems, "\n".join(problems)


def test_the_harness_reads_blocks_markers_and_commands(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        'text\n\n<!-- doc-test: skip-lines "serve": a server -->\n```bash\n'
        "# a comment\nsimkit list \\\n    --help\nsimkit serve X\n```\n\n"
        "```python\nx = 1\n```\n<!-- doc-test: continues -->\n```python\nassert x == 1\n```\n"
        "<!-- doc-test: skip shown, not run -->\n```python\nraise SystemExit(3)\n```\n"
    )
    blocks = blocks_of(page)
    assert [b.lang for b in blocks] == ["bash", "python", "python", "python"]
    assert commands_of(blocks[0]) == ["simkit list      --help", "simkit serve X"]
    assert _skipped_lines(blocks[0]) == [("serve", "a server")]
    assert _skip_reason(blocks[3]) == "shown, not run"
    (tmp_path / "cwd").mkdir()
    assert run_page(page, tmp_path / "cwd") == []
    page.write_text("```python\nraise SystemExit(3)\n```\n```bash\nfalse\n```\n")
    (tmp_path / "cwd2").mkdir()
    failures = run_page(page, tmp_path / "cwd2")
    assert len(failures) == 2
    assert failures[0].startswith("page.md:1 python block: exit 3")
    assert "`false`: exit 1" in failures[1]


def test_a_command_that_hangs_is_stopped_and_reported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys.modules[__name__], "COMMAND_TIMEOUT", 1.0)
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\nsleep 60 & sleep 60\n```\n```python\nimport time; time.sleep(60)\n```\n"
    )
    (tmp_path / "cwd").mkdir()
    started = time.monotonic()
    failures = run_page(page, tmp_path / "cwd")
    assert time.monotonic() - started < 30  # the background sleep of the group is killed too
    assert failures == [
        "page.md:1 `sleep 60 & sleep 60`: still running after 1 s",
        "page.md:4 python block: still running after timeout",
    ]


INLINE_CALL = re.compile(r"`([A-Za-z_]\w*)((?:\.[A-Za-z_]\w*)+)\([^`]*\)`")
"""An inline code span that is a call of a dotted name, ``module.sub.function(...)``."""


def inline_calls(page: Path) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of each inline call span outside the page's fenced blocks
    whose first name is an importable module (``gymnasium.utils.env_checker.check_env``
    in ``gymnasium.utils.env_checker.check_env(env, ...)``); names through a private
    module (``simkit._kernels.pinned_env()``) point at code and are left out."""
    out: list[tuple[int, str]] = []
    fenced = False
    variables = _assigned_names(page)
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        if re.match(r"^\s*```", line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for m in INLINE_CALL.finditer(line):
            if "._" in m.group(2):  # a private name points at code, it is not an API
                continue
            if m.group(1) not in variables and _is_module(m.group(1)):
                out.append((number, m.group(1) + m.group(2)))
    return out


def _assigned_names(page: Path) -> set[str]:
    """Names the page's Python blocks assign (``venv = SB3VecEnv(...)``): a sentence's
    ``venv.seed(s)`` names that variable, not the standard library's ``venv``."""
    code = "\n".join(b.text for b in blocks_of(page) if b.lang == "python")
    return set(re.findall(r"^\s*([A-Za-z_]\w*)\s*(?::[^=\n]*)?=(?!=)", code, re.MULTILINE))


def _is_module(name: str) -> bool:
    """Whether ``name`` is an installed module (simkit, or one outside this checkout:
    ``envs.ping()`` names a variable, not the repository's ``envs/`` folder)."""
    found = importlib.util.find_spec(name)
    if found is None:
        return False
    if found.origin in (None, "built-in", "frozen"):
        return True  # the standard library's (os, sys)
    origin = Path(found.origin).resolve()
    installed = origin.is_relative_to(Path(sys.prefix).resolve())
    return name == "simkit" or installed or not origin.is_relative_to(ROOT)


def page_imports(page: Path) -> set[str]:
    """The modules ``page`` imports anywhere, in a block or in a sentence (``after
    `import zmq.auth` ``)."""
    text = page.read_text()
    return set(re.findall(r"\bimport ([A-Za-z_][\w.]*)", text)) | set(
        re.findall(r"\bfrom ([A-Za-z_][\w.]*) import\b", text)
    )


def unresolved_names(names: list[str], imports: tuple[str, ...] = ()) -> list[str]:
    """Which of ``names`` (dotted, all under one top-level module) do not resolve in a
    fresh interpreter that ran only ``import <module>`` and ``imports``, as a reader who
    copies the call after those imports would find."""
    top = names[0].split(".")[0]
    script = (
        "import sys\n"
        + "".join(f"import {module}\n" for module in (top, *imports))
        + "for name in sys.argv[1:]:\n"
        "    obj = sys.modules[name.split('.')[0]]\n"
        "    try:\n"
        "        for part in name.split('.')[1:]:\n"
        "            obj = getattr(obj, part)\n"
        "    except AttributeError:\n"
        "        print(name)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script, *names], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.split()


def test_inline_calls_of_the_docs_run_after_importing_their_module() -> None:
    """A call written in a sentence is copied as it stands, after ``import <module>``
    (and the imports its page names): ``gymnasium.utils.env_checker.check_env(env)``
    fails that way (``import gymnasium`` does not import ``gymnasium.utils.env_checker``),
    even where a page's blocks, which import simkit (and simkit imports the checker),
    would have run it."""
    where: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for page in PAGES:
        imported = page_imports(page)
        for line, name in inline_calls(page):
            extra = tuple(sorted(m for m in imported if name.startswith(m + ".")))
            where.setdefault((name, extra), []).append(f"{page.relative_to(ROOT)}:{line}")
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for name, extra in sorted(where):
        groups.setdefault((name.split(".")[0], extra), []).append(name)
    problems = [
        f"{', '.join(where[name, extra])}: `{name}(...)` does not resolve after `import "
        f"{module}`; write the import that makes it (`import {name.rsplit('.', 1)[0]}`)"
        for (module, extra), names in groups.items()
        for name in unresolved_names(names, extra)
    ]
    assert not problems, "\n".join(problems)


def test_inline_calls_are_found_outside_fenced_blocks(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Run `gymnasium.utils.env_checker.check_env(env, skip_render_check=True)` and "
        "`os.path.join(a, b)`, not `nosuchmodule.f(x)`, `env.reset()` or `os._exit(0)`.\n"
        "```python\nimport os\n`os.getcwd()`\nvenv = make()\n```\nThen `venv.seed(1)`.\n"
    )
    assert inline_calls(page) == [
        (1, "gymnasium.utils.env_checker.check_env"),
        (1, "os.path.join"),
    ]
    assert unresolved_names(["gymnasium.utils.env_checker.check_env", "gymnasium.make"]) == [
        "gymnasium.utils.env_checker.check_env"
    ]
    names = ["gymnasium.utils.env_checker.check_env"]
    assert unresolved_names(names, ("gymnasium.utils.env_checker",)) == []
    page.write_text("Make keys with `zmq.auth.create_certificates(d)` (after `import zmq.auth`).")
    assert page_imports(page) == {"zmq.auth"}


def test_no_page_promises_a_command_that_exists() -> None:
    """A sentence that says a ``simkit`` subcommand will come is stale once it has come
    (server.md said so of ``serve`` long after it shipped)."""
    from simkit.cli import COMMANDS

    promise = re.compile(
        r"once the `simkit` CLI has the `(\w[\w-]*)`|`simkit (\w[\w-]*)` (?:will|is to) come"
    )
    stale = [
        f"{page.relative_to(ROOT)}: promises `simkit {verb}`, which exists"
        for page in PAGES
        for m in promise.finditer(" ".join(page.read_text().split()))
        for verb in m.groups()
        if verb in COMMANDS
    ]
    assert not stale, "\n".join(stale)


def test_ports_are_replaced_consistently() -> None:
    ports = _ports(["tcp://127.0.0.1:5555 and --metrics-port 9100"])
    assert set(ports) == {"5555", "9100"}
    text = _with_ports("a tcp://127.0.0.1:5555 b --metrics-port 9100 c :5555", ports)
    assert f"127.0.0.1:{ports['5555']}" in text
    assert f"--metrics-port {ports['9100']}" in text
    assert text.endswith(":5555")  # only loopback endpoints and metrics ports change
    assert shlex.split("simkit list")  # commands are plain shell words
