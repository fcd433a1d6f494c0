"""The `enmasse` command: wiring of the verbs to the modules that do the work.

    enmasse up [--demo] | down | status          the local system under supervisord (local/)
    enmasse send ADDRESS | receive ADDRESS       AMQP through a space's router (messaging.py;
                                                 --user NAME logs in as a MessagingUser;
                                                 -P KEY=VALUE, --rate, --body-file, -o json:
                                                 message_lines.py)
    enmasse peek QUEUE                           browse without consuming
    enmasse stats --space S                      per address, from routers and brokers
                                                 (local/address_stats.py)
    enmasse apply -f FILE|DIR [--space S]        manifests -> one atomic Apply per scope (apply.py)
    enmasse get KIND [NAME] [--space S] [-o table|wide|yaml|json|name] [-l SEL]
                [--field-selector SEL] [-w]      kubectl's get (selectors.py, render.py)
    enmasse describe KIND NAME [--space S]       spec, status, placement, audit events
                                                 (describe.py)
    enmasse wait KIND NAME --for=phase=P|delete [--timeout S]   (conditions.py)
    enmasse logs COMPONENT [--space S] [-f]      <var>/log of `up`'s programs (logs.py)
    enmasse completion bash|zsh|fish             click's shell completion
    enmasse delete KIND NAME [--space S]
    enmasse watch KIND [--space S]               events until Ctrl-C
    enmasse validate -f FILE|DIR                 offline, for a manifests repo's CI (offline.py)
    enmasse diff -f FILE|DIR [--prune]           what apply would create/change/prune (diff.py)
    enmasse dashboard [--no-browser]             the console's trace view (dashboard.py)
    enmasse gitops sync --repo URL --path DIR    pull git, apply with prune (gitops.py)
    enmasse token create NAME --role R | list | revoke NAME   access tokens (tokens.py)

Global options: `--server host:port` (else $ENMASSE_SERVER, else <var>/run/config.addr written by
`up`, else 127.0.0.1:5680), `--token` (else $ENMASSE_TOKEN, else <var>/run/admin-token written by
`up`), `--ca-file` (the CA the config service's certificate chains to: else $ENMASSE_CA_FILE,
else <var>/tls/ca.crt written by `up`; none: plaintext), `--var-dir` (else $ENMASSE_VAR, else
./var), `--timeout` (the deadline of every call, seconds), `-v` (debug logs on stderr).

Every failure the user can cause or meet (server down, bad file, refused manifest, stale update,
a space or resource that does not exist) ends as `error: <message>` on stderr with exit code 1,
never a traceback; a usage error (unknown option, bad choice) is click's, exit code 2; `wait`
whose --timeout passed exits 3 (`conditions.TimedOut`). Long verbs (`up`, `down`, `apply`,
`gitops sync`) say what they do on stderr (progress.py): a live display on a terminal, plain
lines otherwise, nothing with --quiet; stdout keeps only their result.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import click
import structlog
from click.shell_completion import CompletionItem, get_completion_class
from enmasse.cli import conditions, message_lines, messaging, offline, selectors
from enmasse.cli import dashboard as dashboard_view
from enmasse.cli import describe as describing
from enmasse.cli import diff as diffs
from enmasse.cli import gitops as gitops_commands
from enmasse.cli import logs as component_logs
from enmasse.cli import tokens as token_commands
from enmasse.cli.apply import batches, outcome_line
from enmasse.cli.client import (
    DEFAULT_TIMEOUT,
    TOKEN_ENV,
    CliError,
    ConfigClient,
    NotFound,
    Unreachable,
    local_ca_file,
    operator_tls,
    resolve_ca_file,
    resolve_server,
    resolve_token,
)
from enmasse.cli.kinds import UnknownKind, resolve_kind
from enmasse.cli.local import address_stats, gateways, readiness, stack
from enmasse.cli.local import runtime as local_runtime
from enmasse.cli.local.var_dir import VarDir
from enmasse.cli.progress import Reporter, open_progress, quiet_option
from enmasse.cli.render import OUTPUTS, make_console, print_change, print_resources, print_table
from enmasse.common.logging import configure_logging
from enmasse.resources.contracts import STANDARD
from enmasse.resources.kinds import KINDS, Kind, key_of, kind_of, object_of
from enmasse.resources.manifests import Loaded, display_name, load_paths
from enmasse.v1 import config_pb2, resources_pb2
from rich.console import Console

log = structlog.get_logger("enmasse.cli")


@dataclass(frozen=True)
class Settings:
    server_option: str | None
    var: VarDir
    timeout: float
    token_option: str | None = None
    patient: bool = False  # calls wait for a config service that is still starting (`up`)
    ca_file_option: str | None = None

    @property
    def server(self) -> str:
        return resolve_server(option=self.server_option, var_dir=self.var.root)

    @property
    def token(self) -> str:
        return resolve_token(option=self.token_option, var_dir=self.var.root)

    def client(self, *, service: str = "") -> ConfigClient:
        """A client of the config service. `service`: a control-plane command (`gitops sync`)
        that calls with the least-privilege token `up` made for it (<var>/run/tokens/), unless
        --token or $ENMASSE_TOKEN says otherwise."""
        return ConfigClient(
            server=self.server,
            timeout=self.timeout,
            token=self._token(service),
            ca_file=self.ca_file,
            wait_for_ready=self.patient,
        )

    @property
    def ca_file(self) -> Path | None:
        """The CA the config service (and an amqps endpoint) is verified against; None:
        plaintext."""
        return resolve_ca_file(option=self.ca_file_option, var_dir=self.var.root)

    def _token(self, service: str) -> str:
        if service and not self.token_option and not os.environ.get(TOKEN_ENV):
            own = self.var.service_token(service)
            if own.is_file():
                return own.read_text().strip()
        return self.token


pass_settings = click.make_pass_decorator(Settings)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--server", metavar="HOST:PORT", help="config service address (order: see above)")
@click.option("--token", metavar="TOKEN", help="access token (order: see above)")
@click.option("--ca-file", metavar="FILE", help="CA certificate of the config service (see above)")
@click.option("--var-dir", metavar="DIR", help="state of `enmasse up` ($ENMASSE_VAR, else ./var)")
@click.option(
    "--timeout",
    type=float,
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="deadline of each call, s",
)
@click.option("-v", "--verbose", is_flag=True, help="debug logs on stderr")
@click.pass_context
def cli(
    ctx: click.Context,
    server: str | None,
    token: str | None,
    ca_file: str | None,
    var_dir: str | None,
    timeout: float,
    verbose: bool,
) -> None:
    """EnMasse-py: messaging as a service. Address spaces and addresses, declared as manifests.

    \b
    The config service is found at --server HOST:PORT, else $ENMASSE_SERVER,
    else the address `enmasse up` wrote to <var-dir>/run/config.addr,
    else 127.0.0.1:5680. Calls carry --token TOKEN, else $ENMASSE_TOKEN,
    else the admin token `enmasse up` wrote to <var-dir>/run/admin-token.
    They go over TLS verified against --ca-file FILE, else $ENMASSE_CA_FILE,
    else <var-dir>/tls/ca.crt (written by `enmasse up`), else plaintext.

    \b
    Exit codes: 0 success; 1 an error (printed as `error: ...` on stderr:
    refused, not found, unreachable, a failed send); 2 a usage error;
    3 `wait` timed out. Shell completion: `enmasse completion bash|zsh|fish`.
    """
    configure_logging(service="cli", renderer="console", level="DEBUG" if verbose else "WARNING")
    ctx.obj = Settings(
        server_option=server,
        var=VarDir.choose(var_dir),
        timeout=timeout,
        token_option=token,
        ca_file_option=ca_file,
    )


def _kind(word: str) -> Kind:
    try:
        return resolve_kind(word)
    except UnknownKind as exc:
        raise CliError(str(exc)) from None


def _space_for(info: Kind, space: str, *, verb: str) -> str:
    if info.space_scoped and not space:
        raise CliError(f"{info.plural} live in an address space: {verb} needs --space SPACE")
    return space if info.space_scoped else ""


# ---------------------------------------------------------------- apply / validate


def load_or_refuse(paths: Sequence[str], *, space: str, outcome: str) -> Loaded:
    """Every manifest of the paths, or every error on stderr and a CliError: all or nothing."""
    loaded = load_paths(paths, default_space=space)
    for error in loaded.errors:
        click.echo(str(error), err=True)
    if loaded.errors:
        raise CliError(f"{len(loaded.errors)} bad manifest(s): {outcome}")
    if not loaded.manifests:
        raise CliError(f"no manifests in {', '.join(paths)}")
    return loaded


def apply_paths(
    settings: Settings,
    paths: Sequence[str],
    *,
    space: str = "",
    dry_run: bool = False,
    prune: bool = False,
    reporter: Reporter | None = None,
) -> None:
    """One Apply per batch; on a terminal a bar counts the manifests applied (`reporter`)."""
    reporter = reporter or Reporter()
    loaded = load_or_refuse(paths, space=space, outcome="nothing applied")
    scheduled = batches(loaded.manifests)
    reporter.step(f"applying {len(loaded.manifests)} manifests", total=len(loaded.manifests))
    with settings.client() as client:
        for batch in scheduled:
            log.debug("apply", space=batch.space, resources=len(batch.resources))
            reply = client.apply(
                space=batch.space, resources=batch.resources, dry_run=dry_run, prune=prune
            )
            for result in reply.results:
                reporter.echo(outcome_line(result, dry_run=dry_run))
            reporter.advance(len(batch.resources))


@cli.command()
@click.option("-f", "--filename", "paths", multiple=True, required=True, metavar="FILE|DIR")
@click.option("-s", "--space", default="", help="for manifests that name no metadata.space")
@click.option("--dry-run", is_flag=True, help="show what would change, change nothing")
@click.option("--prune", is_flag=True, help="delete what the CLI applied earlier and these lack")
@quiet_option
@pass_settings
def apply(
    settings: Settings,
    paths: tuple[str, ...],
    space: str,
    dry_run: bool,
    prune: bool,
    quiet: bool,
) -> None:
    """Create or update the resources of manifest files (one atomic batch per address space)."""
    with open_progress("apply", quiet=quiet, plain_steps=False) as reporter:
        apply_paths(settings, paths, space=space, dry_run=dry_run, prune=prune, reporter=reporter)


@cli.command()
@click.option("-f", "--filename", "paths", multiple=True, required=True, metavar="FILE|DIR")
def validate(paths: tuple[str, ...]) -> None:
    """Check manifests offline; print `file:line: message` per error; exit 1 if any."""
    loaded = load_paths(paths)
    problems = offline.check(loaded)
    for problem in problems:
        click.echo(problem)
    if problems:
        click.echo(f"{len(problems)} error(s)", err=True)
        raise SystemExit(1)
    click.echo(f"{len(loaded.manifests)} manifests valid")


@cli.command()
@click.option("-f", "--filename", "paths", multiple=True, required=True, metavar="FILE|DIR")
@click.option("-s", "--space", default="", help="for manifests that name no metadata.space")
@click.option("--prune", is_flag=True, help="also show what `apply --prune` would delete")
@click.option(
    "--manager",
    default="cli",
    show_default=True,
    help="whose resources a prune touches (the GitOps sync's own name, to preview a sync)",
)
@pass_settings
def diff(settings: Settings, paths: tuple[str, ...], space: str, prune: bool, manager: str) -> None:
    """Show what `apply -f` would create, change, prune or refuse; change nothing.

    Exit code 0 when the apply would go through, 1 when it would refuse something."""
    loaded = load_or_refuse(paths, space=space, outcome="nothing compared")
    # Keyed as ApplyResults name resources: (kind, space or "" for cluster-scoped, name).
    desired = {key_of(m.resource): m.resource for m in loaded.manifests}
    results: list[config_pb2.ApplyResult] = []
    with settings.client() as client:
        for batch in batches(loaded.manifests):
            reply = client.apply(
                space=batch.space,
                resources=batch.resources,
                manager=manager,
                prune=prune,
                dry_run=True,
                atomic=False,  # every refusal with its reason, not the first one as an error
            )
            for result in reply.results:
                results.append(result)
                _echo_change(client, result=result, desired=desired)
    click.echo(diffs.summary_line(results))
    if any(r.action == config_pb2.ApplyResult.REFUSED for r in results):
        raise SystemExit(1)


def _echo_change(
    client: ConfigClient,
    *,
    result: config_pb2.ApplyResult,
    desired: dict[tuple[str, str, str], resources_pb2.Resource],
) -> None:
    if (line := diffs.change_line(result)) is None:
        return
    click.echo(line)
    if result.action != config_pb2.ApplyResult.UPDATED:
        return
    live = client.get(KINDS[result.kind], name=result.ref.name, space=result.ref.space)
    wanted = desired[(result.kind, result.ref.space, result.ref.name)]
    for changed in diffs.spec_diff(live, wanted) or ["(only the password, never shown)"]:
        click.echo(f"    {changed}")


# ---------------------------------------------------------------- get / delete / watch


def _complete_kind(
    _ctx: click.Context, _param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """The kinds' plurals for shell completion (`enmasse get add<TAB>`)."""
    return [
        CompletionItem(kind.plural)
        for kind in KINDS.values()
        if kind.plural.startswith(incomplete.lower())
    ]


def _space_must_exist(client: ConfigClient, info: Kind, space: str) -> None:
    """`get addresses --space nosuch` is an error, as kubectl's `-n nosuch` is not: NotFound
    from the config service (`AddressSpace nosuch not found`), exit code 1."""
    if info.space_scoped and space:
        client.get(KINDS["AddressSpace"], name=space)


def _selector_options(command: click.decorators.FC) -> click.decorators.FC:
    command = click.option(
        "--field-selector",
        "field_selector",
        default="",
        metavar="PATH=VALUE,...",
        help="fields as -o yaml spells them: status.phase=Active,spec.type=queue (= == !=)",
    )(command)
    return click.option(
        "-l",
        "--selector",
        "label_selector",
        default="",
        metavar="SELECTOR",
        help="labels: app=shop,tier!=test,env in (a,b),!legacy",
    )(command)


@cli.command()
@click.argument("kind", shell_complete=_complete_kind)
@click.argument("name", required=False)
@click.option("-s", "--space", default="", help="address space (all spaces when omitted)")
@click.option(
    "-o",
    "--output",
    type=click.Choice(OUTPUTS),
    default="table",
    show_default=True,
    help="wide: more columns (addresses: who manages them, dead letters); name: kind/name",
)
@_selector_options
@click.option("-w", "--watch", "follow", is_flag=True, help="then print each change; Ctrl-C quits")
@pass_settings
def get(
    settings: Settings,
    kind: str,
    name: str | None,
    space: str,
    output: str,
    label_selector: str,
    field_selector: str,
    follow: bool,
) -> None:
    """Show resources of KIND (addresses, addressspaces, addressplans, ...), or one by NAME.

    A missing address space or resource is an error (exit code 1), never an empty list."""
    info = _kind(kind)
    selected = selectors.predicate(labels=label_selector, fields=field_selector)
    with settings.client() as client:
        if name:
            resources = [
                client.get(info, name=name, space=_space_for(info, space, verb="get NAME"))
            ]
        else:
            resources = client.list(info, space=space if info.space_scoped else "")
            if not resources:
                _space_must_exist(client, info, space)
        if selected is not None:
            resources = [r for r in resources if selected(r)]
        console = make_console()
        print_resources(console, info=info, resources=resources, output=output, single=bool(name))
        if follow:
            _follow_changes(
                client, console, info=info, space=space, name=name, output=output, keep=selected
            )


def _follow_changes(
    client: ConfigClient,
    console: Console,
    *,
    info: Kind,
    space: str,
    name: str | None,
    output: str,
    keep: selectors.Predicate | None,
) -> None:
    """`get --watch`: after the listing, one row (or document, or name) per change, as kubectl
    prints them; the watch's own list phase, already printed, is skipped."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    synced = False
    try:
        for event in client.watch(kinds=[info.name], space=space if info.space_scoped else ""):
            if event.type == config_pb2.WatchEvent.SYNCED:
                synced = True
                continue
            if not synced or event.type not in _EVENT_WORDS:
                continue
            if name and object_of(event.object).metadata.name != name:
                continue
            if keep is not None and not keep(event.object):
                continue
            deleted = event.type == config_pb2.WatchEvent.DELETED
            print_change(console, info=info, resource=event.object, output=output, deleted=deleted)
    except KeyboardInterrupt:
        return


@cli.command()
@click.argument("kind")
@click.argument("name")
@click.option("-s", "--space", default="", help="address space of the resource")
@click.option(
    "--resource-version",
    type=int,
    default=0,
    help="delete only if it is still at this version (from `get -o yaml`)",
)
@pass_settings
def delete(settings: Settings, kind: str, name: str, space: str, resource_version: int) -> None:
    """Delete one resource (an address space takes its addresses and users with it)."""
    info = _kind(kind)
    with settings.client() as client:
        client.delete(
            info,
            name=name,
            space=_space_for(info, space, verb="delete"),
            resource_version=resource_version,
        )
    click.echo(f"{info.name.lower()}/{name} deleted")


_EVENT_WORDS = {
    config_pb2.WatchEvent.ADDED: "ADDED",
    config_pb2.WatchEvent.MODIFIED: "MODIFIED",
    config_pb2.WatchEvent.DELETED: "DELETED",
}


def event_line(event: config_pb2.WatchEvent) -> str | None:
    """`ADDED address/orders space=demo phase=Pending`, or None for bookkeeping events."""
    word = _EVENT_WORDS.get(event.type)
    if word is None:
        return None
    message = object_of(event.object)
    parts = [f"{word:<8}", display_name(event.object)]
    if message.metadata.space:
        parts.append(f"space={message.metadata.space}")
    if kind_of(event.object) in ("Address", "AddressSpace") and message.status.status.phase:
        parts.append(f"phase={message.status.status.phase}")
    return " ".join(parts)


@cli.command()
@click.argument("kind")
@click.option("-s", "--space", default="", help="address space (all spaces when omitted)")
@pass_settings
def watch(settings: Settings, kind: str, space: str) -> None:
    """Print each change of KIND as it happens (existing ones first); Ctrl-C quits."""
    info = _kind(kind)
    # Ctrl-C, and a polite kill, end the stream quietly, even when started with SIGINT ignored
    # (as a shell's background job is).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with settings.client() as client:
        # fail fast, with a deadline; a space that does not exist is an error, as in `get`
        if not client.list(info, space=space if info.space_scoped else ""):
            _space_must_exist(client, info, space)
        try:
            for event in client.watch(kinds=[info.name], space=space):
                if event.type == config_pb2.WatchEvent.SYNCED:
                    log.debug("synced", revision=event.revision)
                if (line := event_line(event)) is not None:
                    click.echo(line)
        except KeyboardInterrupt:
            return


# ---------------------------------------------------------------- describe / wait / logs


@cli.command()
@click.argument("kind", shell_complete=_complete_kind)
@click.argument("name")
@click.option("-s", "--space", default="", help="address space of the resource")
@pass_settings
def describe(settings: Settings, kind: str, name: str, space: str) -> None:
    """Show one resource in full: labels, spec, status and conditions, placement or endpoints,
    and its recent events from the config service's audit log (<var-dir>/log/config.log)."""
    info = _kind(kind)
    space = _space_for(info, space, verb="describe")
    with settings.client() as client:
        resource = client.get(info, name=name, space=space)
    files = describing.audit_log_files(settings.var.log)
    events = (
        describing.audit_events(files, kind=info.name, space=space, name=name) if files else None
    )
    source = str(settings.var.log / "config.log")
    click.echo(describing.describe(info, resource, events=events, events_source=source))


@cli.command()
@click.argument("kind", shell_complete=_complete_kind)
@click.argument("name")
@click.option("-s", "--space", default="", help="address space of the resource")
@click.option(
    "--for",
    "condition",
    required=True,
    metavar="phase=PHASE|delete",
    help="phase=Active (any phase), or delete: until it is gone",
)
@click.option(
    "--timeout",
    "wait_s",
    type=click.FloatRange(0),
    default=30.0,
    show_default=True,
    help="seconds; then exit code 3",
)
@pass_settings
def wait(
    settings: Settings, kind: str, name: str, space: str, condition: str, wait_s: float
) -> None:
    """Block until a resource meets a condition: `--for=phase=Active`, or `--for=delete`.

    \b
    Exit codes: 0 the condition holds; 3 --timeout passed first (the error
    says what the resource is instead); 1 anything else (unknown kind, the
    resource does not exist while waiting for a phase, no config service)."""
    info = _kind(kind)
    wanted = conditions.parse_condition(condition)
    space = _space_for(info, space, verb="wait")
    what = f"{info.name.lower()}/{name}"
    with settings.client() as client:

        def fetch() -> resources_pb2.Resource | None:
            try:
                return client.get(info, name=name, space=space)
            except NotFound:
                return None

        conditions.wait_until_met(fetch=fetch, condition=wanted, what=what, timeout=wait_s)
    click.echo(f"{what} condition met")


@cli.command()
@click.argument("component")
@click.option("-s", "--space", default="", help="only this space's routers/brokers/gateways")
@click.option(
    "--tail", "lines", type=int, default=-1, help="the last N lines of each log [all of them]"
)
@click.option("-f", "--follow", is_flag=True, help="then print new lines as written; Ctrl-C quits")
@pass_settings
def logs(settings: Settings, component: str, space: str, lines: int, follow: bool) -> None:
    """Print the log of a program `enmasse up` runs (<var-dir>/log/COMPONENT.log).

    COMPONENT is a program (config, router-agent, storage-controller, etcd, demo-router-0, ...)
    or a role (router, broker, mqtt-gateway): every one of that role, in --space SPACE if
    given; lines of several logs start with [program]."""
    files = component_logs.select(settings.var.log, component=component, space=space)
    for line in component_logs.show(files, lines=lines):
        click.echo(line)
    if not follow:
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        for line in component_logs.follow(files):
            click.echo(line)
    except KeyboardInterrupt:
        return


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the shell completion script for SHELL (click's): verbs, options and kinds.

    \b
    bash:  source <(enmasse completion bash)     (or into ~/.bashrc)
    zsh:   source <(enmasse completion zsh)
    fish:  enmasse completion fish > ~/.config/fish/completions/enmasse.fish"""
    root = ctx.find_root()
    prog = root.info_name or "enmasse"
    shell_class = get_completion_class(shell)
    if shell_class is None:  # click knows the three the Choice allows
        raise CliError(f"no completion for {shell}")
    variable = f"_{prog.replace('-', '_').upper()}_COMPLETE"
    click.echo(shell_class(root.command, {}, prog, variable).source())


# ---------------------------------------------------------------- up / down / status


def _examples_dir() -> Path | None:
    beside_sources = Path(__file__).resolve().parents[4] / "examples"
    env = os.environ.get("ENMASSE_EXAMPLES")
    candidate = Path(env) if env else beside_sources
    return candidate if candidate.is_dir() else None


def _print_spaces_and_addresses(
    settings: Settings, *, server: str
) -> list[resources_pb2.AddressSpace]:
    """Prints the address spaces and addresses; returns the spaces."""
    console = make_console()
    listed: dict[str, list[resources_pb2.Resource]] = {}
    with ConfigClient(
        server=server, timeout=settings.timeout, token=settings.token, ca_file=settings.ca_file
    ) as client:
        for name in ("AddressSpace", "Address"):
            info = KINDS[name]
            listed[name] = client.list(info)
            print_resources(
                console, info=info, resources=listed[name], output="table", single=False
            )
            console.out("")
    return [r.address_space for r in listed["AddressSpace"]]


READY_TIMEOUT = 180.0


def _demo_space(folder: Path) -> str:
    """The first standard address space the examples declare: the one the demo talks to."""
    for manifest in load_paths([str(folder)]).manifests:
        if kind_of(manifest.resource) == "AddressSpace":
            space = object_of(manifest.resource)
            if space.spec.type == STANDARD:
                return str(space.metadata.name)
    raise CliError(f"{folder} declares no standard address space to demonstrate")


def _declared_spaces(folder: Path) -> list[str]:
    """Every address space the examples declare (`up --demo` waits for all of them, so that
    what it prints at the end is every space's endpoints)."""
    return [
        str(object_of(manifest.resource).metadata.name)
        for manifest in load_paths([str(folder)]).manifests
        if kind_of(manifest.resource) == "AddressSpace"
    ]


def _wait_ready(
    client: ConfigClient, var: VarDir, *, spaces: Sequence[str], timeout: float, settled_ok: bool
) -> None:
    """Until every address of `spaces` is ready by what their routers run now, not only by what
    the store says (`readiness.laggards`); CliError naming the laggards after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            lagging = {
                space: why
                for space in spaces
                if (why := _laggards(client, var, space=space, settled_ok=settled_ok))
            }
        except Unreachable as error:  # a connection that broke under load: not ready yet
            lagging = {space: [str(error)] for space in spaces}
        if not lagging:
            return
        if time.monotonic() > deadline:
            raise CliError(
                "; ".join(
                    f"address space '{space}' not ready within {timeout:.0f} s: {'; '.join(why)}"
                    for space, why in lagging.items()
                )
            )
        time.sleep(0.3)


def _laggards(client: ConfigClient, var: VarDir, *, space: str, settled_ok: bool) -> list[str]:
    found = client.get(KINDS["AddressSpace"], name=space).address_space
    addresses = [w.address for w in client.list(KINDS["Address"], space=space)]
    routers = (
        readiness.routers_of(readiness.directory(var.root), space, tls=operator_tls(var.root))
        if found.spec.type == STANDARD
        else []
    )
    return readiness.laggards(
        space=found, addresses=addresses, routers=routers, settled_ok=settled_ok
    )


def _ready_step(spaces: Sequence[str]) -> str:
    if not spaces:
        return "no address spaces yet: nothing to wait for"
    return f"waiting until every address is ready in {', '.join(spaces)}"


def _echo_where(settings: Settings, *, address: str) -> None:
    """The end of `up`: where the rest runs (beside each space's endpoints, printed before)."""
    var = settings.var
    ca = local_ca_file(var.root)
    transport = f"TLS, CA {ca}" if ca is not None else "plaintext"
    click.echo(f"config service: {address} ({transport})")
    click.echo(f"admin token: {var.admin_token} (the CLI's by default; $ENMASSE_TOKEN elsewhere)")
    click.echo(f"logs: {var.log} (enmasse logs COMPONENT)")
    if var.console_url.is_file():  # the web console, once it listens
        click.echo(f"console: {var.console_url.read_text().strip()}")


def _echo_endpoints(client: ConfigClient) -> None:
    for wrapped in client.list(KINDS["AddressSpace"]):
        space = wrapped.address_space
        for endpoint in space.status.endpoints:
            click.echo(f"{space.metadata.name}: {endpoint.name} {endpoint.host}:{endpoint.port}")


def _demo_login(folder: Path, *, space: str) -> messaging.Login | None:
    """The user the examples declare for the demo space: the demo's clients log in as it."""
    users = [
        object_of(manifest.resource)
        for manifest in load_paths([str(folder)]).manifests
        if kind_of(manifest.resource) == "MessagingUser"
    ]
    return messaging.demo_login(users, space=space)


def _demo_round(client: ConfigClient, *, space: str, login: messaging.Login | None) -> bool:
    endpoint = messaging.space_endpoint(client.get(KINDS["AddressSpace"], name=space).address_space)
    addresses = [w.address for w in client.list(KINDS["Address"], space=space)]
    results = [
        messaging.demo_one(endpoint, a, login=login) for a in messaging.demo_addresses(addresses)
    ]
    for result in results:
        click.echo(result.line())
    return all(r.ok for r in results)


@cli.command()
@click.option("--demo", is_flag=True, help="then apply examples/ and send a message on each type")
@click.option("--examples", metavar="DIR", help="manifests for --demo (default: examples/)")
@click.option(
    "--mqtt-gateways",
    type=click.IntRange(1, gateways.MAX_INSTANCES),
    default=None,
    help="MQTT gateway instances per standard space (kept; default: as before, first 1)",
)
@quiet_option
@pass_settings
def up(
    settings: Settings, demo: bool, examples: str | None, mqtt_gateways: int | None, quiet: bool
) -> None:
    """Start etcd, the control plane, routers and brokers under supervisord (again: start what
    is not running), then wait until every address is ready: Active in the store AND run by
    every router of its space (Pending and Failed ones are not waited for). With --demo, apply
    examples/, wait until each of them is ready, send and receive.

    Each step shows on stderr as it happens; at the end, stdout says what runs where: the
    config service, each space's endpoints, the admin token's file, the logs."""
    if mqtt_gateways is not None:  # the runtime's next pass starts (or stops) instances
        gateways.set_instances(settings.var, mqtt_gateways)
    with open_progress("up", quiet=quiet) as reporter:
        _up(settings, demo=demo, examples=examples, reporter=reporter)


def _up(settings: Settings, *, demo: bool, examples: str | None, reporter: Reporter) -> None:
    address, started = stack.up(settings.var, step=reporter.step)
    word = "started" if started else "already running"
    reporter.echo(f"enmasse {word}: config service at {address} (state in {settings.var.root})")
    server_settings = Settings(
        server_option=address,
        var=settings.var,
        timeout=settings.timeout,
        token_option=settings.token_option,
        patient=True,
        ca_file_option=settings.ca_file_option,
    )
    if not demo:
        with server_settings.client() as client:
            # Phases in the store may be an earlier run's: wait until the routers run them.
            spaces = [w.address_space.metadata.name for w in client.list(KINDS["AddressSpace"])]
            reporter.step(_ready_step(spaces))
            _wait_ready(client, settings.var, spaces=spaces, timeout=READY_TIMEOUT, settled_ok=True)
            reporter.close()
            _echo_endpoints(client)
            _echo_where(settings, address=address)
        return
    folder = Path(examples) if examples else _examples_dir()
    if folder is None:
        raise CliError("no examples directory found: give --examples DIR")
    space = _demo_space(folder)
    apply_paths(server_settings, [str(folder)], reporter=reporter)
    with server_settings.client() as client:
        spaces = _declared_spaces(folder)
        reporter.step(_ready_step(spaces))
        _wait_ready(client, settings.var, spaces=spaces, timeout=READY_TIMEOUT, settled_ok=False)
        reporter.close()  # what follows is the result: tables, endpoints, the demo round
        click.echo("")
        _print_spaces_and_addresses(settings, server=address)
        _echo_endpoints(client)
        _echo_where(settings, address=address)
        click.echo("")
        if not _demo_round(client, space=space, login=_demo_login(folder, space=space)):
            raise CliError("the demo round failed (see above)")


def _login_options(command: click.decorators.FC) -> click.decorators.FC:
    """--user and --password: the MessagingUser send and receive log in as (SCRAM when the
    router offers it); without --user the client comes in anonymously, if the plan allows."""
    command = click.option(
        "--password",
        envvar="ENMASSE_PASSWORD",
        help="the user's password (or $ENMASSE_PASSWORD)",
    )(command)
    return click.option("--user", metavar="NAME", help="log in as this MessagingUser")(command)


def _login(user: str | None, password: str | None) -> messaging.Login | None:
    if user is None:
        return None
    if password is None:
        raise CliError("--user needs --password (or $ENMASSE_PASSWORD)")
    return messaging.Login(user=user, password=password)


def _target_options(command: click.decorators.FC) -> click.decorators.FC:
    """Where send, receive and peek go: the space's router, or --url (and its CA)."""
    command = click.option(
        "--ca-file", metavar="FILE", help="amqps: the CA to verify it against [<var>/tls/ca.crt]"
    )(command)
    command = click.option(
        "--url",
        metavar="amqp[s]://HOST:PORT[,...]",
        help="routers to use, in failover order (else the space's)",
    )(command)
    return click.option("-s", "--space", default="demo", show_default=True, help="address space")(
        command
    )


_MESSAGE_OUTPUT = click.option(
    "-o",
    "--output",
    type=click.Choice(["body", "json"]),
    default="body",
    show_default=True,
    help="json: one JSON line per message (body, header, properties, application properties)",
)


def _print_messages(payloads: Sequence[bytes], *, output: str) -> None:
    for payload in payloads:
        if output == "json":
            click.echo(message_lines.as_json(payload))
        else:
            click.echo(messaging.body_text(payload))


@cli.command()
@click.argument("address")
@_target_options
@click.option("-n", "--count", type=click.IntRange(1, 100_000), default=1, show_default=True)
@click.option("--body", default="hello", show_default=True, help="message body (text)")
@click.option(
    "--body-file",
    metavar="FILE|-",
    help="the body from a file (- : stdin); sent --count times, or line by line with --lines",
)
@click.option("--lines", is_flag=True, help="with --body-file: one message per non-empty line")
@click.option(
    "-P",
    "--property",
    "properties",
    multiple=True,
    metavar="KEY=VALUE",
    help="application property (repeatable); numbers, true/false typed as JSON reads them",
)
@click.option("--durable", is_flag=True, help="mark messages durable (stored to disk)")
@click.option("--ttl", type=click.IntRange(1), default=None, help="time to live, ms")
@click.option(
    "--rate", type=click.FloatRange(min=0, min_open=True), help="at most this many a second"
)
@click.option(
    "--timeout", "wait_s", type=float, default=5.0, show_default=True, help="s, per message"
)
@click.option(
    "--trace", is_flag=True, help="trace each message (OTLP-JSON under $ENMASSE_VAR/traces)"
)
@_login_options
@pass_settings
def send(
    settings: Settings,
    address: str,
    space: str,
    url: str | None,
    ca_file: str | None,
    count: int,
    body: str,
    body_file: str | None,
    lines: bool,
    properties: tuple[str, ...],
    durable: bool,
    ttl: int | None,
    rate: float | None,
    wait_s: float,
    trace: bool,
    user: str | None,
    password: str | None,
) -> None:
    """Send messages to ADDRESS through a router of the space; print their outcome.

    \b
    enmasse send orders -n 10 --rate 5 -P region=eu --ttl 60000 --durable
    seq 3 | enmasse send orders --body-file - --lines

    Exit code 1 when any message was not accepted."""
    to_send = message_lines.bodies(body=body, count=count, body_file=body_file, lines=lines)
    application = message_lines.parse_properties(properties)
    endpoints, kind = _messaging_target(
        settings, space=space, address=address, url=url, ca_file=ca_file
    )
    outcomes = messaging.send(
        endpoints,
        address=address,
        bodies=to_send,
        durable=durable,
        ttl=ttl,
        application_properties=application,
        rate=rate,
        timeout=wait_s,
        trace_space=space if trace else None,
        login=_login(user, password),
    )
    click.echo(
        messaging.sent_line(count=len(to_send), kind=kind, address=address, outcomes=outcomes)
    )
    if any(o is not messaging.Outcome.ACCEPTED for o in outcomes):
        raise SystemExit(1)


@cli.command()
@click.argument("address")
@_target_options
@click.option("-n", "--count", type=click.IntRange(1, 100_000), default=1, show_default=True)
@click.option(
    "--timeout", "wait_s", type=float, default=5.0, show_default=True, help="seconds in all"
)
@click.option("--durable-subscription", metavar="NAME", help="read a durable subscription")
@_MESSAGE_OUTPUT
@click.option(
    "--trace", is_flag=True, help="trace each message (OTLP-JSON under $ENMASSE_VAR/traces)"
)
@_login_options
@pass_settings
def receive(
    settings: Settings,
    address: str,
    space: str,
    url: str | None,
    ca_file: str | None,
    count: int,
    wait_s: float,
    durable_subscription: str | None,
    output: str,
    trace: bool,
    user: str | None,
    password: str | None,
) -> None:
    """Receive up to COUNT messages from ADDRESS (accepting each); print their bodies, or with
    -o json one JSON line each. Exit code 1 when fewer than COUNT came in time."""
    endpoints, _kind = _messaging_target(
        settings, space=space, address=address, url=url, ca_file=ca_file
    )
    payloads = messaging.receive(
        endpoints,
        address=address,
        count=count,
        timeout=wait_s,
        subscription=durable_subscription,
        trace_space=space if trace else None,
        login=_login(user, password),
    )
    _print_messages(payloads, output=output)
    if len(payloads) < count:
        raise CliError(f"only {len(payloads)} of {count} messages within {wait_s:g} s")


@cli.command()
@click.argument("address")
@_target_options
@click.option("-n", "--count", type=click.IntRange(1, 100_000), default=10, show_default=True)
@click.option(
    "--timeout",
    "wait_s",
    type=float,
    default=2.0,
    show_default=True,
    help="stop when no message came for this long, s",
)
@_MESSAGE_OUTPUT
@_login_options
@pass_settings
def peek(
    settings: Settings,
    address: str,
    space: str,
    url: str | None,
    ca_file: str | None,
    count: int,
    wait_s: float,
    output: str,
    user: str | None,
    password: str | None,
) -> None:
    """Browse the first COUNT messages of a queue without consuming them (AMQP `copy`
    distribution mode); an empty queue prints nothing."""
    endpoints, _kind = _messaging_target(
        settings, space=space, address=address, url=url, ca_file=ca_file
    )
    payloads = messaging.peek(
        endpoints[0], address=address, count=count, timeout=wait_s, login=_login(user, password)
    )
    _print_messages(payloads, output=output)


@cli.command()
@click.option("-s", "--space", required=True, help="address space")
@pass_settings
def stats(settings: Settings, space: str) -> None:
    """Per address of the space: messages in and out, stored, consumers and producers, asked of
    its routers and brokers now (the local installation's, with `enmasse up`'s operator
    certificate). In a standard space IN/OUT/CONSUMERS/PRODUCERS are the routers' (summed),
    STORED the brokers'; a brokered space's are its broker's."""
    with settings.client() as client:
        found = client.get(KINDS["AddressSpace"], name=space).address_space
        addresses = [w.address for w in client.list(KINDS["Address"], space=space)]
    tls = operator_tls(settings.var.root)
    gathered = address_stats.gather(readiness.directory(settings.var.root), space=found, tls=tls)
    print_table(
        make_console(), address_stats.HEADERS, address_stats.rows(addresses, gathered, space=found)
    )
    for silent in gathered.silent:
        click.echo(f"no answer from {silent}", err=True)
    if gathered.silent:
        raise SystemExit(1)


def _messaging_target(
    settings: Settings, *, space: str, address: str, url: str | None, ca_file: str | None
) -> tuple[list[messaging.Endpoint], str]:
    """The routers to talk to, in order (the first that answers; the next when it is lost),
    and the address's type ("" when unknown: the router decides)."""
    if url:
        ca = Path(ca_file) if ca_file else settings.ca_file
        return messaging.parse_urls(url, ca_file=ca), ""
    with settings.client() as client:
        endpoints = messaging.space_endpoints(
            client.get(KINDS["AddressSpace"], name=space).address_space
        )
        kinds = [
            w.address.spec.type
            for w in client.list(KINDS["Address"], space=space)
            if w.address.spec.address == address
        ]
    return endpoints, kinds[0] if kinds else ""


@cli.command()
@quiet_option
@pass_settings
def down(settings: Settings, quiet: bool) -> None:
    """Stop supervisord and everything it started (and nothing else). Data stays in the var dir.

    Each step shows on stderr as it happens."""
    with open_progress("down", quiet=quiet) as reporter:
        stopped = stack.down(settings.var, step=reporter.step)
    if not stopped:
        click.echo(f"enmasse is not running (nothing to stop in {settings.var.root})")
        return
    click.echo(f"stopped: {stack.stopped_text(stopped)}")


@cli.command()
@pass_settings
def status(settings: Settings) -> None:
    """Processes (state, pid, uptime), then address spaces and addresses with their phase, then
    what each router and broker runs now, asked of it: a router's generation and addresses, the
    generation the router-agent wants and when the router last confirmed one; what each broker
    holds.

    Exit code 0 only when every process runs and the config service answers."""
    if not stack.running(settings.var):
        raise CliError(f"enmasse is not running (no supervisord for {settings.var.root})")
    rows = stack.processes(settings.var)
    console = make_console()
    print_table(
        console,
        ("PROCESS", "STATE", "PID", "UPTIME"),
        [(r.name, r.state, str(r.pid) if r.pid else "-", r.uptime) for r in rows],
    )
    console.out("")
    # The config service of this var dir, not whatever $ENMASSE_SERVER names.
    server = settings.server_option or stack.config_address(settings.var)
    spaces = _print_spaces_and_addresses(settings, server=server)
    _print_routers_and_brokers(console, var=settings.var, spaces=spaces)
    if any(r.state != "RUNNING" for r in rows):
        raise SystemExit(1)


def _print_routers_and_brokers(
    console: Console, *, var: VarDir, spaces: Sequence[resources_pb2.AddressSpace]
) -> None:
    found = readiness.directory(var.root)
    tls = operator_tls(var.root)  # the operator's: these ports know callers by certificate
    agent = readiness.agent_view(stack.router_agent_address(var), tls=tls)
    names = [s.metadata.name for s in spaces]
    standard = [s.metadata.name for s in spaces if s.spec.type == STANDARD]
    routers = [run for space in standard for run in readiness.routers_of(found, space, tls=tls)]
    brokers = [held for space in names for held in readiness.brokers_of(found, space, tls=tls)]
    print_table(
        console,
        ("SPACE", "ROUTER", "RUNS", "DESIRED", "ADDRESSES", "REACHABLE", "CONFIRMED"),
        [
            readiness.router_row(run, agent.get((run.space, run.router_id)), now=time.time())
            for run in routers
        ],
    )
    console.out("")
    print_table(
        console,
        ("SPACE", "BROKER", "REACHABLE", "QUEUES", "TOPICS", "SUBSCRIPTIONS", "ANSWER"),
        [readiness.broker_row(held) for held in brokers],
    )


@cli.group(hidden=True)
def runtime() -> None:
    """Internals of `enmasse up` that run as supervised programs."""


@runtime.command()
@click.option("--interval", type=float, default=0.5, show_default=True, help="seconds")
@pass_settings
def reconcile(settings: Settings, interval: float) -> None:
    """Follow the GitOps output: start and stop routers and brokers under supervisord."""
    configure_logging(service="runtime")
    local_runtime.run(settings.var, interval=interval)


# ---------------------------------------------------------------- dashboard


@cli.command()
@click.option("--no-browser", is_flag=True, help="print the URL only, open no browser")
@click.option("--path", metavar="FILE|DIR", help="the static dashboard.html [<var-dir>/analytics]")
@click.option("--serve", "serve_it", is_flag=True, help="serve the static one on loopback")
@click.option("--port", type=int, default=0, show_default=True, help="with --serve; 0 = free")
@pass_settings
def dashboard(
    settings: Settings, no_browser: bool, path: str | None, serve_it: bool, port: int
) -> None:
    """Open the console's trace view (the URL is printed; no display or --no-browser: only
    printed). --path / --serve: the static dashboard `enmasse-analytics` wrote."""
    if path is None and not serve_it:
        url = dashboard_view.trace_view(settings.var)
        click.echo(dashboard_view.show(url, browser=not no_browser))
        return
    page = dashboard_view.locate(var_root=settings.var.root, path=path)
    if not serve_it:
        click.echo(dashboard_view.show(page.as_uri(), browser=not no_browser))
        return
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    dashboard_view.serve(page, port=port, announce=lambda url: click.echo(url))


cli.add_command(gitops_commands.gitops)
cli.add_command(token_commands.token)


def main() -> None:
    cli(prog_name="enmasse")


if __name__ == "__main__":
    main()
