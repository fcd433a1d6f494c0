"""End to end: a space's connections in the web console, and Close (issue #20, item 1), in a real
headless Chromium; `enmasse dashboard --no-browser` against the console that runs (item 4).

A stack of this module's own (`enmasse up`), two address spaces of the `development` plan (so a
Qpid Proton client may log in with PLAIN on the plain port), a tenant-admin token of one and a
viewer token of the same one. A real Proton client (its own container id, logged in as the
space's messaging user `app`, a receiver on `calls` with credit) is connected to each space's
router. In Chromium, the tenant:

- opens its space's connections page and sees its client's connection (container id, user,
  remote host:port, open since, the link's address, direction and credit / unsettled /
  delivered, as the router counts them), closes it, and the Proton client gets
  `amqp:connection:forced` with the description naming the console, the space and the token's
  fingerprint; the console logged the close as an audit event;
- gets the API's own refusal, word for word, on the other space's connections page and on a
  Close posted for the other space's router, whose client stays connected;
- with the viewer token, a Close is refused with the API's message (a viewer may not write).

Screenshots: bench/out/console-connections*.png. Bounded waits only; every process is stopped
by PID at the end (`running`), and each Proton client's thread is joined.
"""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from enmasse.console.connections import token_fingerprint
from enmasse.resources.discovery import LocalDirectory
from proton import Condition, Event
from proton.handlers import MessagingHandler
from proton.reactor import ApplicationEvent, Container, EventInjector
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.fixtures.local_runtime import LocalRuntime, enmasse, running
from tests.test_e2e_console import TOKEN_COOKIE, screenshot, script, until
from tests.test_e2e_console import browser as browser

pytestmark = pytest.mark.slow

TENANT_SPACE, OTHER_SPACE = "conn-shop", "conn-other"
USER, PASSWORD = "app", "app-password"
ADDRESS = "calls"
CREDIT = 7


def _manifests(space: str) -> str:
    return f"""
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {{name: {space}}}
spec: {{type: standard, plan: development}}
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {{name: {ADDRESS}, space: {space}}}
spec: {{address: {ADDRESS}, type: anycast, plan: standard-anycast}}
---
apiVersion: enmasse.io/v1
kind: MessagingUser
metadata: {{name: {USER}, space: {space}}}
spec:
  username: {USER}
  password: {PASSWORD}
  authorization: [{{addresses: [{ADDRESS}], operations: [recv]}}]
"""


class ProtonClient(MessagingHandler):  # type: ignore[misc]
    """A Qpid Proton client on its own thread: one connection (container id `container_id`,
    logged in with PLAIN), one receiver on ADDRESS with CREDIT; `closed` resolves with the
    condition the peer closed the connection with."""

    def __init__(self, *, port: int, container_id: str) -> None:
        super().__init__(prefetch=CREDIT)
        self.url = f"amqp://127.0.0.1:{port}"
        self.container_id = container_id
        self.attached: Future[None] = Future()
        self.closed: Future[Condition | None] = Future()
        self.injector = EventInjector()
        self.connection: object | None = None
        self.seen: list[str] = []  # what else happened, for a failing test's message
        self.link_closed: Future[Condition | None] = Future()

    def on_start(self, event: Event) -> None:
        event.container.selectable(self.injector)
        self.connection = event.container.connect(
            self.url,
            user=USER,
            password=PASSWORD,
            allowed_mechs="PLAIN",
            allow_insecure_mechs=True,
            reconnect=False,
        )
        event.container.create_receiver(self.connection, ADDRESS)

    def on_link_remote_close(self, event: Event) -> None:
        assert event.link is not None
        if not self.link_closed.done():
            self.link_closed.set_result(event.link.remote_condition)
        event.link.close()

    def on_link_error(self, event: Event) -> None:
        """Proton's default closes the connection too; this client keeps it (the test looks)."""

    def on_link_opened(self, event: Event) -> None:
        if not self.attached.done():
            self.attached.set_result(None)

    def on_connection_remote_close(self, event: Event) -> None:
        assert event.connection is not None
        self._closed(event, event.connection.remote_condition)

    def on_transport_error(self, event: Event) -> None:
        assert event.transport is not None
        condition = event.transport.condition
        if not self.attached.done():
            self.attached.set_exception(AssertionError(f"no connection: {condition}"))
        self._closed(event, condition)

    def on_unhandled(self, method: str, *args: object) -> None:
        self.seen.append(method)

    def on_leave(self, event: Event) -> None:  # the test is over: close from our side
        if self.connection is not None and not self.closed.done():
            self.connection.close()  # type: ignore[attr-defined]
        self.injector.close()

    def _closed(self, event: Event, condition: Condition | None) -> None:
        if not self.closed.done():
            self.closed.set_result(condition)
        if event.connection is not None:
            event.connection.close()
        self.injector.close()


@contextlib.contextmanager
def proton_client(port: int, *, container_id: str) -> Iterator[ProtonClient]:
    client = ProtonClient(port=port, container_id=container_id)
    container = Container(client)
    container.container_id = container_id

    def run() -> None:
        try:
            container.run()
        except BaseException as error:  # the test reads it from the futures
            for future in (client.attached, client.closed):
                if not future.done():
                    future.set_exception(error)
            raise

    thread = threading.Thread(target=run, name=f"proton-{container_id}", daemon=True)
    thread.start()
    try:
        client.attached.result(timeout=30)
        yield client
    finally:
        if thread.is_alive():
            client.injector.trigger(ApplicationEvent("leave"))
        thread.join(timeout=30)
        assert not thread.is_alive(), f"the Proton client {container_id} did not stop"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRuntime]:
    with running(tmp_path_factory.mktemp("console-connections") / "var") as runtime:
        runtime.apply(_manifests(TENANT_SPACE) + "---" + _manifests(OTHER_SPACE))
        for space in (TENANT_SPACE, OTHER_SPACE):
            runtime.wait_active(space, [ADDRESS])
        yield runtime


def _token(stack: LocalRuntime, name: str, role: str) -> str:
    made = enmasse(stack.var, "token", "create", name, "--role", role, "-s", TENANT_SPACE)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[0]


@pytest.fixture(scope="module")
def console_url(stack: LocalRuntime) -> str:
    done = enmasse(stack.var, "dashboard", "--no-browser")
    assert done.returncode == 0, done.stderr
    url = (stack.var / "run" / "console.url").read_text().strip()
    # `enmasse dashboard` prints the running console's trace view, and only that.
    assert done.stdout == f"{url}/traces\n"
    return url


def _log_in(browser: WebDriver, console_url: str, token: str) -> None:
    browser.get(console_url + "/login")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "#login-form button").click()
    until(lambda: browser.current_url == console_url + "/", timeout=30, what="not logged in")


def _row(browser: WebDriver, container_id: str, cell: str) -> str | None:
    found: str | None = script(
        browser,
        f"const r = document.querySelector('tr[data-container=\"{container_id}\"]');"
        f" const c = r && r.querySelector('.{cell}'); return c && c.innerText;",
    )
    return found


SHOP_ROW = 'tr[data-container="shop-proton-client"]'
CLOSE_ERROR = "const e = document.getElementById('close-error'); return e && e.innerText;"


def _page_text(browser: WebDriver) -> str:
    return str(script(browser, "return document.body.innerText") or "")


def _shown_after_refresh(browser: WebDriver, container_id: str) -> bool:
    browser.refresh()
    return _row(browser, container_id, "container") == container_id


def _console_audit(var: Path) -> list[dict[str, object]]:
    events = []
    for log in (var / "log").glob("console*.log"):
        for line in log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("event") == "audit":
                    events.append(event)
    return events


def _router_of(var: Path, space: str) -> str:
    directory = LocalDirectory(var)
    directory.refresh()
    return directory.routers(space)[0].router_id


def _post_close(browser: WebDriver, action: str) -> None:
    """Posts a Close as the page's form would (the browser's cookie goes with it)."""
    script(
        browser,
        f"const f = document.createElement('form'); f.method = 'post'; f.action = '{action}';"
        " document.body.appendChild(f); f.submit();",
    )


def test_a_tenant_closes_its_clients_connection_and_not_another_spaces(
    stack: LocalRuntime, console_url: str, browser: WebDriver
) -> None:
    tenant = _token(stack, "conn-team", "tenant-admin")
    shop_port, other_port = stack.router_port(TENANT_SPACE), stack.router_port(OTHER_SPACE)
    with (
        proton_client(shop_port, container_id="shop-proton-client") as shop_client,
        proton_client(other_port, container_id="other-proton-client") as other_client,
    ):
        _log_in(browser, console_url, tenant)
        browser.get(f"{console_url}/spaces/{TENANT_SPACE}")
        browser.find_element(By.ID, "connections").click()
        page = f"{console_url}/spaces/{TENANT_SPACE}/connections"
        until(
            lambda: _shown_after_refresh(browser, "shop-proton-client"),
            timeout=30,
            what=f"the client's connection is not listed: {_page_text(browser)!r}",
        )
        assert browser.current_url == page
        assert _row(browser, "shop-proton-client", "user") == USER
        assert (_row(browser, "shop-proton-client", "remote") or "").startswith("127.0.0.1:")
        assert (_row(browser, "shop-proton-client", "opened") or "").endswith(" UTC")
        assert (
            _row(browser, "shop-proton-client", "link .figures")
            == f"{ADDRESS} to client · {CREDIT} / 0 / 0"
        )
        assert _row(browser, "other-proton-client", "container") is None  # another space's
        screenshot(browser, "connections")
        key = str(
            script(
                browser,
                "return document.querySelector('tr[data-container=\"shop-proton-client\"]')"
                ".dataset.name",
            )
        )
        router, _, connection_id = key.partition("/")
        closed_by = (
            f"closed from the EnMasse console by token {token_fingerprint(tenant)} "
            f"of address space '{TENANT_SPACE}'"
        )

        # One link first: the client hears of it on the link, its connection goes on.
        link = script(browser, f"return document.querySelector('{SHOP_ROW} .link').dataset.link")
        assert str(link).startswith("sender ")  # the router sends to the client's receiver
        script(browser, f"document.querySelector('{SHOP_ROW} .links button.link-close').click();")
        until(
            lambda: browser.current_url.startswith(page + "?closed="),
            timeout=30,
            what="not back on the connections page after closing the link",
        )
        until(shop_client.link_closed.done, timeout=30, what=f"no detach: {shop_client.seen}")
        detached = shop_client.link_closed.result()
        assert detached is not None
        assert (detached.name, detached.description) == ("amqp:link:detach-forced", closed_by)
        until(
            lambda: (
                _shown_after_refresh(browser, "shop-proton-client")
                and _row(browser, "shop-proton-client", "links") == "no link"
            ),
            timeout=30,
            what=f"the closed link is still listed: {_page_text(browser)!r}",
        )
        assert not shop_client.closed.done()
        screenshot(browser, "connections-link-closed")

        script(browser, f"document.querySelector('{SHOP_ROW} button.connection-close').click();")
        until(
            lambda: browser.current_url.startswith(page + "?closed="),
            timeout=30,
            what="not back on the connections page after Close",
        )
        until(shop_client.closed.done, timeout=30, what=f"not closed: {shop_client.seen}")
        condition = shop_client.closed.result()
        assert condition is not None
        assert (condition.name, condition.description) == ("amqp:connection:forced", closed_by)
        until(
            lambda: not _shown_after_refresh(browser, "shop-proton-client"),
            timeout=30,
            what="the closed connection is still listed",
        )
        screenshot(browser, "connections-closed")
        # Closed already (ids are never reused): the router's answer, on the page.
        _post_close(browser, f"/spaces/{TENANT_SPACE}/connections/{key}/close")
        gone = f"router '{router}' has no connection {connection_id}"
        until(
            lambda: script(browser, CLOSE_ERROR) == gone,
            timeout=30,
            what=f"no refusal of a second Close: {_page_text(browser)!r}",
        )
        closes = [
            {k: e.get(k) for k in ("who", "kind", "space", "name", "outcome", "reason")}
            for e in _console_audit(stack.var)
        ]
        who = f"token {token_fingerprint(tenant)}"
        assert closes == [
            {"who": who, "kind": "Link", "space": TENANT_SPACE, "name": f"{key}/{link}",
             "outcome": "ok", "reason": ""},
            {"who": who, "kind": "Connection", "space": TENANT_SPACE, "name": key,
             "outcome": "ok", "reason": ""},
            {"who": who, "kind": "Connection", "space": TENANT_SPACE, "name": key,
             "outcome": "refused", "reason": gone},
        ]  # fmt: skip

        # The other space: the API's refusal, word for word, to look and to close.
        refusal = (
            f"token 'conn-team' (tenant-admin of {TENANT_SPACE}) may not GetAddressSpace "
            f"in address space '{OTHER_SPACE}'"
        )
        browser.get(f"{console_url}/spaces/{OTHER_SPACE}/connections")
        assert browser.find_element(By.ID, "api-error").text == refusal
        screenshot(browser, "connections-refused")
        other_router = _router_of(stack.var, OTHER_SPACE)
        _post_close(browser, f"/spaces/{OTHER_SPACE}/connections/{other_router}/1/close")
        until(
            lambda: script(browser, "const e = document.getElementById('api-error');"
                           " return e && e.innerText;") == refusal,
            timeout=30,
            what="the Close in another space was not refused",
        )  # fmt: skip
        assert not other_client.closed.done()
        assert len(_console_audit(stack.var)) == 3  # refused by the API: audited there


def test_a_viewer_may_look_but_not_close(stack: LocalRuntime, console_url: str) -> None:
    viewer = _token(stack, "conn-viewer", "viewer")
    shop_port = stack.router_port(TENANT_SPACE)
    with proton_client(shop_port, container_id="viewed-proton-client") as client:
        cookie = {"Cookie": f"{TOKEN_COOKIE}={viewer}"}
        page = f"{console_url}/spaces/{TENANT_SPACE}/connections"
        with urllib.request.urlopen(urllib.request.Request(page, headers=cookie), timeout=30) as r:
            assert 'data-container="viewed-proton-client"' in r.read().decode()
        router = _router_of(stack.var, TENANT_SPACE)
        close = urllib.request.Request(
            f"{page}/{router}/1/close", method="POST", headers=cookie, data=b""
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(close, timeout=30)
        assert refused.value.code == 403
        body = refused.value.read().decode()
        assert (
            f"token &#39;conn-viewer&#39; (viewer of {TENANT_SPACE}) may not Apply "
            f"in address space &#39;{TENANT_SPACE}&#39;"
        ) in body
        assert not client.closed.done()
