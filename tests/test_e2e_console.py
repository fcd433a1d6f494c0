"""End to end: the web console in a real headless Chromium (issue #20, item 1).

A stack of this module's own (`enmasse up`, which starts `enmasse-console` beside config and
writes its URL to <var>/run/console.url), two address spaces, and a tenant-admin token of one
of them. Chromium (Debian's `chromium`, driven by Selenium through Debian's `chromium-driver`:
nothing downloaded) logs in with that token and:

- sees only its tenant's space, with endpoints and phase (the API lists no other for the
  token), and gets the API's own refusal on a page of the other space;
- creates an address and watches it become Active on the same page, without a reload (the
  page follows the API's Watch through server-sent events), sends messages to it (the CLI, as a
  messaging user) and watches its live figures move (messages in, stored: the console asks the
  space's routers and brokers with `enmasse up`'s read-only operator certificate), then deletes
  it and watches the row go, while the API confirms it gone;
- gets a refused address back with the API's message beside the field (the message is the one
  rule's own, `enmasse.resources.validation.address_problem`), and a messaging user refused
  without a password, then created, shown, edited and deleted.

A screenshot of each page is written to bench/out/console-*.png (git-ignored) for people to
look at. Bounded waits only; every process is stopped by PID at the end (`running`).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from enmasse.resources.kinds import KINDS
from enmasse.resources.validation import address_problem
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from tests.fixtures.local_runtime import LocalRuntime, enmasse, running, wait_until

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOTS = Path(__file__).resolve().parents[1] / "bench" / "out"
WINDOW = (1280, 900)
TOKEN_COOKIE = "enmasse_console_token"
TENANT_SPACE, OTHER_SPACE = "console-shop", "console-other"

LIVE_ERROR = "const e = document.getElementById('live-error'); return !e.hidden && e.innerText;"
LOGIN_ERROR = "const e = document.getElementById('login-error'); return e && e.innerText;"

SENDER_PASSWORD = "sender-password"
SENDER = f"""
apiVersion: enmasse.io/v1
kind: MessagingUser
metadata: {{name: sender, space: {TENANT_SPACE}}}
spec:
  username: sender
  password: {SENDER_PASSWORD}
  authorization: [{{addresses: [orders], operations: [send]}}]
"""

SPACES = f"""
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {{name: {TENANT_SPACE}}}
spec: {{type: standard, plan: standard-small}}
---
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {{name: {OTHER_SPACE}}}
spec: {{type: standard, plan: standard-small}}
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRuntime]:
    with running(tmp_path_factory.mktemp("console") / "var") as runtime:
        runtime.apply(SPACES)
        yield runtime


@pytest.fixture(scope="module")
def tenant_token(stack: LocalRuntime) -> str:
    made = enmasse(
        stack.var, "token", "create", "shop-team", "--role", "tenant-admin", "-s", TENANT_SPACE
    )
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[0]


@pytest.fixture(scope="module")
def console_url(stack: LocalRuntime) -> str:
    url_file = stack.var / "run" / "console.url"
    assert wait_until(url_file.exists, timeout=30), "enmasse-console wrote no URL"
    return url_file.read_text().strip()


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    for needed, package in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")]:
        if not needed.exists():
            pytest.fail(f"{needed} is missing: scripts/setup installs the Debian `{package}`")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument(f"--window-size={WINDOW[0]},{WINDOW[1]}")
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    # An element a submitted form's answer brings (an error beside a field) is waited for.
    driver.implicitly_wait(10)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def signed_in(console_url: str, tenant_token: str, browser: WebDriver) -> WebDriver:
    """The browser, logged in with the tenant's token (after one refused token)."""
    browser.get(console_url + "/")
    assert browser.current_url == console_url + "/login"  # no cookie: the login page
    browser.find_element(By.ID, "token").send_keys("not-a-token")
    browser.find_element(By.CSS_SELECTOR, "#login-form button").click()
    until(
        lambda: "token" in (script(browser, LOGIN_ERROR) or "").lower(),
        timeout=30,
        what="a refused token: no message on the login page",
    )
    screenshot(browser, "login-refused")
    browser.find_element(By.ID, "token").send_keys(tenant_token)
    browser.find_element(By.CSS_SELECTOR, "#login-form button").click()
    until(
        lambda: browser.current_url == console_url + "/",
        timeout=30,
        what=f"not logged in: {script(browser, 'return document.body.innerText')!r}",
    )
    # The token is in a cookie the page's scripts cannot read, never sent by another site.
    cookie = browser.get_cookie(TOKEN_COOKIE)
    assert cookie is not None
    assert cookie["value"] == tenant_token
    assert (cookie["httpOnly"], cookie["sameSite"]) == (True, "Strict")
    assert tenant_token not in (script(browser, "return document.cookie") or "")
    return browser


def screenshot(browser: WebDriver, page: str) -> None:
    """The whole page, below the fold too (Chromium's DevTools capture beyond the viewport)."""
    assert isinstance(browser, webdriver.Chrome)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    size = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = browser.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    (SCREENSHOTS / f"console-{page}.png").write_bytes(base64.b64decode(shot["data"]))


def script(browser: WebDriver, code: str) -> Any:
    """Reads the page through JavaScript: rows the live stream replaces are never stale here."""
    try:
        return browser.execute_script(code)
    except WebDriverException:
        return None


def row_text(browser: WebDriver, table: str, name: str) -> str | None:
    found: str | None = script(
        browser,
        f"const row = document.querySelector('#{table} tr[data-name=\"{name}\"]');"
        " return row && row.innerText;",
    )
    return found


def figure(browser: WebDriver, address: str, which: str) -> str | None:
    """One live figure of an address's row: `in`, `out`, `stored` or `links`."""
    found: str | None = script(
        browser,
        f"const f = document.querySelector('#addresses tr[data-name=\"{address}\"] .{which}');"
        " return f && f.innerText;",
    )
    return found


def phase_shown(browser: WebDriver, address: str) -> str | None:
    found: str | None = script(
        browser,
        f"const phase = document.querySelector('#addresses tr[data-name=\"{address}\"] .phase');"
        " return phase && phase.innerText;",
    )
    return found


def user_cells(browser: WebDriver, user: str) -> list[str] | None:
    found: list[str] | None = script(
        browser,
        f"return Array.from(document.querySelectorAll('#users tr[data-name=\"{user}\"] td'),"
        " (td) => td.innerText.trim());",
    )
    return found


def click_in_row(browser: WebDriver, table: str, name: str, what: str) -> None:
    """Clicks in a row through JavaScript: the live stream may replace the row any time, which
    leaves an element Selenium found before stale."""
    clicked = script(
        browser,
        f"const e = document.querySelector('#{table} tr[data-name=\"{name}\"] {what}');"
        " if (e) { e.click(); } return !!e;",
    )
    assert clicked, f"no {what} in the row of {name} in #{table}"


def until(condition: Callable[[], object], *, timeout: float, what: str) -> None:
    assert wait_until(condition, timeout=timeout, interval=0.3), what


def test_a_tenant_sees_only_its_spaces(signed_in: WebDriver, console_url: str) -> None:
    browser = signed_in
    browser.get(console_url + "/")
    rows = browser.find_elements(By.CSS_SELECTOR, "#spaces tbody tr")
    assert [row.get_attribute("data-space") for row in rows] == [TENANT_SPACE]
    until(
        lambda: _reload_shows(browser, "Active") and "amqp://127.0.0.1:" in _spaces_text(browser),
        timeout=120,
        what=f"{TENANT_SPACE} not Active with endpoints: {_spaces_text(browser)}",
    )
    screenshot(browser, "spaces")
    # The other tenant's space: the API's refusal, as it words it.
    browser.get(f"{console_url}/spaces/{OTHER_SPACE}")
    refusal = browser.find_element(By.ID, "api-error").text
    assert OTHER_SPACE in refusal
    screenshot(browser, "refused-space")


def _spaces_text(browser: WebDriver) -> str:
    return str(script(browser, "return document.getElementById('spaces').innerText") or "")


def _reload_shows(browser: WebDriver, phase: str) -> bool:
    browser.refresh()
    return phase in _spaces_text(browser)


def test_an_address_is_created_becomes_active_live_and_is_deleted(
    signed_in: WebDriver, console_url: str, stack: LocalRuntime
) -> None:
    browser = signed_in
    browser.get(f"{console_url}/spaces/{TENANT_SPACE}")
    browser.find_element(By.ID, "new-address").click()
    browser.find_element(By.ID, "name").send_keys("orders")
    screenshot(browser, "address-form")
    browser.find_element(By.ID, "save").click()
    until(
        lambda: browser.current_url == f"{console_url}/spaces/{TENANT_SPACE}",
        timeout=30,
        what="not back on the space page after saving",
    )
    # A mark on this page: still there when the row says Active, so no reload put it there.
    script(browser, "window.consoleTestMark = 'same page';")
    until(
        lambda: phase_shown(browser, "orders") == "Active",
        timeout=120,
        what=f"orders not Active: {row_text(browser, 'addresses', 'orders')!r}",
    )
    assert script(browser, "return window.consoleTestMark") == "same page"
    assert "live" in browser.find_element(By.ID, "live").text
    assert stack.phases(TENANT_SPACE)["orders"] == "Active"
    screenshot(browser, "space")

    # Messages sent (by the CLI, as a messaging user) move the figures on the same page.
    stack.apply(SENDER)
    sent = enmasse(
        stack.var, "send", "orders", "-s", TENANT_SPACE, "--count", "5",
        "--user", "sender", "--password", SENDER_PASSWORD,
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    until(
        lambda: (
            figure(browser, "orders", "stored") == "stored 5"
            and (figure(browser, "orders", "in") or "").endswith("(5)")
        ),
        timeout=60,
        what=f"the figures did not move: {row_text(browser, 'addresses', 'orders')!r}",
    )
    assert script(browser, "return window.consoleTestMark") == "same page"
    assert figure(browser, "orders", "links") == "consumers 0 · producers 0"  # the CLI left
    screenshot(browser, "space-figures")

    click_in_row(browser, "addresses", "orders", "button.danger")
    until(
        lambda: row_text(browser, "addresses", "orders") is None,
        timeout=60,
        what="the deleted address's row is still shown",
    )
    assert "orders" not in stack.phases(TENANT_SPACE)


def test_a_refused_address_shows_the_apis_message_beside_the_field(
    signed_in: WebDriver, console_url: str, stack: LocalRuntime
) -> None:
    browser = signed_in
    browser.get(f"{console_url}/spaces/{TENANT_SPACE}/addresses/new")
    browser.find_element(By.ID, "name").send_keys("bad")
    browser.find_element(By.ID, "address").send_keys("a..b")
    browser.find_element(By.ID, "save").click()
    beside = browser.find_element(By.CSS_SELECTOR, ".field.invalid #address-error").text
    assert beside == address_problem("a..b")
    # What was typed stays, and nothing was written.
    assert browser.find_element(By.ID, "address").get_attribute("value") == "a..b"
    assert "bad" not in stack.phases(TENANT_SPACE)
    screenshot(browser, "address-refused")


def test_a_messaging_user_is_refused_then_created_and_deleted(
    signed_in: WebDriver, console_url: str
) -> None:
    browser = signed_in
    browser.get(f"{console_url}/spaces/{TENANT_SPACE}/users/new")
    browser.find_element(By.ID, "name").send_keys("app")
    browser.find_element(By.ID, "authorization").send_keys("send, recv: orders/#")
    browser.find_element(By.ID, "save").click()
    assert browser.find_element(By.ID, "password-error").text == (
        "is required when a messaging user is created"
    )
    screenshot(browser, "user-refused")
    browser.find_element(By.ID, "password").send_keys("s3cret-pass")
    browser.find_element(By.ID, "save").click()
    until(
        lambda: browser.current_url == f"{console_url}/spaces/{TENANT_SPACE}",
        timeout=30,
        what="not back on the space page after saving",
    )
    assert user_cells(browser, "app") == ["app", "app", "send, recv: orders/#", "Edit Delete"]
    screenshot(browser, "space-with-user")

    # Edit: the rules change, the password (empty: unchanged) stays.
    click_in_row(browser, "users", "app", "a")
    rules = browser.find_element(By.ID, "authorization")
    assert rules.get_attribute("value") == "send, recv: orders/#"
    rules.clear()
    rules.send_keys("recv: orders")
    screenshot(browser, "user-edit")
    browser.find_element(By.ID, "save").click()
    until(
        lambda: user_cells(browser, "app") == ["app", "app", "recv: orders", "Edit Delete"],
        timeout=30,
        what=f"the edited rule is not shown: {user_cells(browser, 'app')!r}",
    )
    click_in_row(browser, "users", "app", "button.danger")
    until(
        lambda: row_text(browser, "users", "app") is None,
        timeout=30,
        what="the deleted user's row is still shown",
    )


def test_an_address_is_edited_through_the_api(
    signed_in: WebDriver, console_url: str, stack: LocalRuntime
) -> None:
    """An anycast address's address string changes; a type the plan does not serve is refused
    beside the type field, as the API words it."""
    browser = signed_in
    browser.get(f"{console_url}/spaces/{TENANT_SPACE}/addresses/new")
    browser.find_element(By.ID, "name").send_keys("calls")
    Select(browser.find_element(By.ID, "plan")).select_by_value("standard-anycast")
    Select(browser.find_element(By.ID, "type")).select_by_value("anycast")
    browser.find_element(By.ID, "save").click()
    until(
        lambda: phase_shown(browser, "calls") is not None,
        timeout=30,
        what="the new anycast address is not listed",
    )
    click_in_row(browser, "addresses", "calls", "a")
    Select(browser.find_element(By.ID, "type")).select_by_value("queue")
    browser.find_element(By.ID, "save").click()
    refusal = browser.find_element(By.ID, "type-error").text
    assert refusal == "cannot change from 'anycast' to 'queue'"
    screenshot(browser, "address-edit-refused")

    Select(browser.find_element(By.ID, "type")).select_by_value("anycast")
    address = browser.find_element(By.ID, "address")
    address.clear()
    address.send_keys("calls/v2")
    browser.find_element(By.ID, "save").click()
    until(
        lambda: "calls/v2" in (row_text(browser, "addresses", "calls") or ""),
        timeout=30,
        what=f"the edited address is not shown: {row_text(browser, 'addresses', 'calls')!r}",
    )
    with stack.client() as client:
        edited = client.get(KINDS["Address"], name="calls", space=TENANT_SPACE).address
    assert (edited.spec.address, edited.spec.type) == ("calls/v2", "anycast")
    click_in_row(browser, "addresses", "calls", "button.danger")
    until(
        lambda: row_text(browser, "addresses", "calls") is None,
        timeout=60,
        what="the deleted address's row is still shown",
    )


def test_a_revoked_token_is_sent_back_to_the_login_then_logout(
    signed_in: WebDriver, console_url: str, stack: LocalRuntime
) -> None:
    """Kept last in the module: it ends the tenant's session."""
    browser = signed_in
    browser.get(f"{console_url}/spaces/{TENANT_SPACE}")
    until(lambda: figure(browser, "dlq", "stored") is not None, timeout=30, what="no figures")
    revoked = enmasse(stack.var, "token", "revoke", "shop-team")
    assert revoked.returncode == 0, revoked.stderr
    # The open page: its stream stops (figures included) with the API's refusal.
    until(
        lambda: "revoked" in (script(browser, LIVE_ERROR) or ""),
        timeout=30,
        what=f"the open page did not stop: {script(browser, LIVE_ERROR)!r}",
    )
    screenshot(browser, "space-token-revoked")
    browser.get(console_url + "/")
    until(
        lambda: browser.current_url.startswith(console_url + "/login"),
        timeout=30,
        what=f"a revoked token still shows {browser.current_url}",
    )
    assert browser.find_element(By.ID, "login-error").text == (
        "Your token is no longer accepted: log in again."
    )
    assert browser.get_cookie(TOKEN_COOKIE) is None
    screenshot(browser, "login-expired")

    # The admin logs in and out: after logout no page opens without logging in again.
    admin = (stack.var / "run" / "admin-token").read_text().strip()
    browser.find_element(By.ID, "token").send_keys(admin)
    browser.find_element(By.CSS_SELECTOR, "#login-form button").click()
    until(
        lambda: {TENANT_SPACE, OTHER_SPACE} <= set(_spaces_text(browser).split()),
        timeout=30,
        what=f"the admin does not see every space: {_spaces_text(browser)!r}",
    )
    browser.find_element(By.ID, "logout").click()
    until(
        lambda: browser.current_url == console_url + "/login",
        timeout=30,
        what="logout did not go back to the login page",
    )
    browser.get(f"{console_url}/spaces/{TENANT_SPACE}")
    assert browser.current_url == console_url + "/login"
