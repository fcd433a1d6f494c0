"""The console's web layer: routes, the login cookie, pages and the live stream.

In: browser requests. Out: HTML pages (templates/, rendered from the view models of views.py),
redirects after each write, and one `text/event-stream` per open space page (live.py). Every
resource comes from the config service's admin API (admin_api.py) called with the token the
user logged in with: the console stores nothing. The live figures come from the space's routers
and brokers (data_plane.py), asked only for a space the API has just shown to that token.

The login: the user pastes a token (what `enmasse token create` printed); the console asks the
API for the address spaces with it and, when the API takes it, keeps it in an HttpOnly,
SameSite=Strict cookie (Secure when served over HTTPS): page scripts never read it, and other
sites cannot make the browser send it with a write. An API answer of UNAUTHENTICATED (a token
revoked or expired meanwhile) drops the cookie and goes back to the login page.

Writes follow post/redirect/get: a form posts, the API writes (or refuses: the form comes back
with the API's message beside the field it names, forms.py), and the browser is sent to the
space's page, where the live stream shows the address go from Pending to Active.

A space's connections page lists its routers' connections and links (connections.py); its Close
(of a connection, or of one link) is the one write the console makes outside the API: the API
must first show the space to the token and let it write there (`AdminApi.may_write`), then the
router closes that client (amqp:connection:forced) or link (amqp:link:detach-forced), and the
console audits it (audit.py).

The trace views (/traces, and one address's /spaces/S/addresses/A/traces) read the analytics
job's tables (traces.py) in a worker thread, keeping only the rows of the spaces the API has just
listed for the token (or of the one space it has just shown it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
from enmasse.console import audit, live, traces
from enmasse.console.admin_api import AdminApi, Refusal
from enmasse.console.connections import close_description, token_fingerprint
from enmasse.console.data_plane import SAMPLE_SECONDS, CloseRefused, DataPlane
from enmasse.console.figures import Sample, figures
from enmasse.console.forms import (
    ADDRESS_FIELDS,
    FORM,
    USER_FIELDS,
    AddressForm,
    FieldErrors,
    UserForm,
    field_errors,
)
from enmasse.console.views import (
    address_types,
    address_views,
    plan_choices,
    space_view,
    space_views,
    user_views,
)
from enmasse.v1 import resources_pb2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

TOKEN_COOKIE = "enmasse_console_token"
TRACES_RELOAD_SECONDS = 10
"""The trace pages reload themselves (a meta refresh, no script): `--live` tables move that fast."""
HERE = Path(__file__).parent
templates = Jinja2Templates(directory=str(HERE / "templates"))

Page = Callable[[Request, AdminApi, str], Awaitable[Response]]


def _api(request: Request) -> AdminApi:
    api: AdminApi = request.app.state.api
    return api


def _login_redirect(message: str = "") -> Response:
    target = "/login" + (f"?why={message}" if message else "")
    response = RedirectResponse(target, status_code=303)
    response.delete_cookie(TOKEN_COOKIE, path="/")
    return response


def _error_page(request: Request, refusal: Refusal) -> Response:
    status = {
        grpc.StatusCode.NOT_FOUND: 404,
        grpc.StatusCode.PERMISSION_DENIED: 403,
        grpc.StatusCode.UNAVAILABLE: 503,
    }.get(refusal.code, 400)
    return templates.TemplateResponse(
        request, "error.html", {"message": refusal.message}, status_code=status
    )


def signed_in(page: Page) -> Callable[[Request], Awaitable[Response]]:
    """A page for a signed-in user: without the cookie, or with a token the API no longer
    takes, the login page; any other refusal of the API, a page saying what it said."""

    async def endpoint(request: Request) -> Response:
        token = request.cookies.get(TOKEN_COOKIE, "")
        if not token:
            return _login_redirect()
        try:
            return await page(request, _api(request), token)
        except Refusal as refusal:
            if refusal.code == grpc.StatusCode.UNAUTHENTICATED:
                return _login_redirect("expired")
            return _error_page(request, refusal)

    return endpoint


# ---------------------------------------------------------------- login


async def login_page(request: Request) -> Response:
    why = request.query_params.get("why", "")
    message = "Your token is no longer accepted: log in again." if why == "expired" else ""
    return templates.TemplateResponse(request, "login.html", {"error": message})


async def login(request: Request) -> Response:
    form = await request.form()
    token = str(form.get("token", "")).strip()
    if not token:
        return templates.TemplateResponse(
            request, "login.html", {"error": "Paste an access token."}, status_code=400
        )
    try:
        await _api(request).address_spaces(token=token)
    except Refusal as refusal:
        return templates.TemplateResponse(
            request, "login.html", {"error": refusal.message}, status_code=401
        )
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(
        TOKEN_COOKIE,
        token,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


async def logout(request: Request) -> Response:
    return _login_redirect()


# ---------------------------------------------------------------- spaces


async def spaces_page(request: Request, api: AdminApi, token: str) -> Response:
    spaces = space_views(await api.address_spaces(token=token))
    return templates.TemplateResponse(request, "spaces.html", {"spaces": spaces})


async def space_page(request: Request, api: AdminApi, token: str) -> Response:
    space = request.path_params["space"]
    view = space_view(await api.address_space(space, token=token))
    addresses = address_views(await api.addresses(space, token=token))
    users = user_views(await api.users(space, token=token))
    context = {
        "space": view,
        "addresses": addresses,
        "users": users,
        "figures": request.app.state.data_plane is not None,
    }
    return templates.TemplateResponse(request, "space.html", context)


async def space_events(request: Request, api: AdminApi, token: str) -> Response:
    space = request.path_params["space"]
    # Refused here: an error page, not a stream. Only a space the API shows this token gets
    # figures from the data plane.
    found = await api.address_space(space, token=token)
    data_plane: DataPlane | None = request.app.state.data_plane
    return StreamingResponse(
        _event_stream(api, space=found, token=token, data_plane=data_plane),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _event_stream(
    api: AdminApi,
    *,
    space: resources_pb2.AddressSpace,
    token: str,
    data_plane: DataPlane | None,
) -> AsyncIterator[str]:
    """The Watch of the space's addresses as SSE frames, with the figures every few seconds
    (with a data plane) and a keepalive comment while nothing changes. Pump tasks read the
    Watch and sample the figures, so that waiting for a keepalive never cancels a read of the
    stream; they end with the response (the browser left) or when the Watch ends."""
    frames: asyncio.Queue[str | None] = asyncio.Queue()
    name = space.metadata.name

    async def pump() -> None:
        try:
            async for event in api.watch(kinds=["Address"], space=name, token=token):
                if (frame := live.frame_of(event)) is not None:
                    frames.put_nowait(frame)
        except Refusal as refusal:
            frames.put_nowait(live.refusal_frame(refusal.message))
        frames.put_nowait(None)

    async def sample(plane: DataPlane) -> None:
        previous: Sample | None = None
        while True:
            try:  # the token may see the space still (not revoked, not expired)
                found = await api.address_space(name, token=token)
            except Refusal as refusal:
                frames.put_nowait(live.refusal_frame(refusal.message))
                frames.put_nowait(None)
                return
            current = await plane.sample(found)
            shown = figures(previous=previous, current=current)
            frames.put_nowait(live.figures_frame(shown, silent=current.silent))
            previous = current
            await asyncio.sleep(SAMPLE_SECONDS)

    tasks = [asyncio.create_task(pump())]
    if data_plane is not None:
        tasks.append(asyncio.create_task(sample(data_plane)))
    try:
        while True:
            try:
                async with asyncio.timeout(live.KEEPALIVE_SECONDS):
                    frame = await frames.get()
            except TimeoutError:
                yield live.KEEPALIVE
                continue
            if frame is None:
                return
            yield frame
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


# ---------------------------------------------------------------- traces


async def traces_page(request: Request, api: AdminApi, token: str) -> Response:
    """Every address with trace figures in the spaces the API lists for the token."""
    spaces = space_views(await api.address_spaces(token=token))
    names = [space.name for space in spaces]
    listed = await asyncio.gather(*(api.addresses(name, token=token) for name in names))
    tables = await asyncio.to_thread(traces.read, request.app.state.analytics, spaces=names)
    resource_names = {
        (name, address.spec.address): address.metadata.name
        for name, addresses in zip(names, listed, strict=True)
        for address in addresses
    }
    context = {
        "freshness": tables.freshness,
        "spaces": [(name, tables.of_space(name)) for name in names],
        "resource_names": resource_names,
        "reload_seconds": TRACES_RELOAD_SECONDS,
    }
    return templates.TemplateResponse(request, "traces.html", context)


async def address_traces_page(request: Request, api: AdminApi, token: str) -> Response:
    """One address's trace figures, once the API has shown the token that address."""
    space, name = request.path_params["space"], request.path_params["name"]
    address = await api.address(space, name, token=token)
    tables = await asyncio.to_thread(traces.read, request.app.state.analytics, spaces=[space])
    context = {
        "space": space,
        "name": name,
        "address": address.spec.address,
        "freshness": tables.freshness,
        "traced": tables.addresses.get((space, address.spec.address)),
        "reload_seconds": TRACES_RELOAD_SECONDS,
    }
    return templates.TemplateResponse(request, "address_traces.html", context)


# ---------------------------------------------------------------- connections


async def _connections_page(
    request: Request,
    *,
    space: resources_pb2.AddressSpace,
    error: str = "",
    status_code: int = 200,
) -> Response:
    data_plane: DataPlane | None = request.app.state.data_plane
    routers = await data_plane.connections(space) if data_plane is not None else None
    context = {
        "space": space.metadata.name,
        "routers": routers,
        "closed": request.query_params.get("closed", ""),
        "error": error,
    }
    return templates.TemplateResponse(request, "connections.html", context, status_code=status_code)


async def connections_page(request: Request, api: AdminApi, token: str) -> Response:
    found = await api.address_space(request.path_params["space"], token=token)
    return await _connections_page(request, space=found)


Close = Callable[[DataPlane, resources_pb2.AddressSpace, str], Awaitable[None]]
"""One close on the data plane: (data plane, the space, the description the client gets)."""


async def _close(
    request: Request, api: AdminApi, token: str, *, rpc: str, name: str, close: Close
) -> Response:
    """A Close (of a connection or a link): only in a space the API shows the token and lets it
    write in; the router and connection must be that space's (data_plane.py); audited either
    way once the API let it through (audit.py)."""
    space = request.path_params["space"]
    found = await api.address_space(space, token=token)
    await api.may_write(space, token=token)
    data_plane: DataPlane | None = request.app.state.data_plane
    client = request.client
    event = {
        "who": f"token {token_fingerprint(token)}",
        "rpc": rpc,
        "space": space,
        "name": name,
        "peer": f"{client.host}:{client.port}" if client else "",
    }
    try:
        if data_plane is None:
            raise CloseRefused("this console does not see the routers")
        await close(data_plane, found, close_description(space=space, token=token))
    except CloseRefused as refused:
        audit.record_close(**event, outcome=audit.REFUSED, reason=str(refused))
        return await _connections_page(request, space=found, error=str(refused), status_code=404)
    audit.record_close(**event, outcome=audit.OK)
    return RedirectResponse(f"/spaces/{space}/connections?closed={name}", status_code=303)


async def close_connection(request: Request, api: AdminApi, token: str) -> Response:
    router, connection_id = request.path_params["router"], request.path_params["id"]

    async def close(plane: DataPlane, space: resources_pb2.AddressSpace, reason: str) -> None:
        await plane.close_connection(
            space, router_id=router, connection_id=connection_id, reason=reason
        )

    name = f"{router}/{connection_id}"
    return await _close(request, api, token, rpc="CloseConnection", name=name, close=close)


async def close_link(request: Request, api: AdminApi, token: str) -> Response:
    router, connection_id = request.path_params["router"], request.path_params["id"]
    fields = _strings(await request.form())
    link, role = fields.get("name", ""), fields.get("role", "")

    async def close(plane: DataPlane, space: resources_pb2.AddressSpace, reason: str) -> None:
        await plane.close_link(
            space,
            router_id=router,
            connection_id=connection_id,
            name=link,
            role=role,
            reason=reason,
        )

    name = f"{router}/{connection_id}/{role} {link}"
    return await _close(request, api, token, rpc="CloseLink", name=name, close=close)


# ---------------------------------------------------------------- addresses


async def _address_form_page(
    request: Request,
    api: AdminApi,
    token: str,
    *,
    form: AddressForm,
    create: bool,
    errors: FieldErrors | None = None,
) -> Response:
    space = request.path_params["space"]
    view = await api.address_space(space, token=token)
    try:
        space_plan = await api.address_space_plan(view.spec.plan, token=token)
    except Refusal:
        space_plan = None  # the API decides anyway, and says why beside the field
    address_plans = await api.address_plans(token=token)
    choices = plan_choices(space_plan=space_plan, address_plans=address_plans)
    context = {
        "space": space,
        "form": form,
        "create": create,
        "errors": errors or {},
        "form_error": (errors or {}).get(FORM, ""),
        "plans": choices,
        "types": address_types(choices),
    }
    status = 400 if errors else 200
    return templates.TemplateResponse(request, "address_form.html", context, status_code=status)


async def new_address_page(request: Request, api: AdminApi, token: str) -> Response:
    return await _address_form_page(request, api, token, form=AddressForm(), create=True)


async def edit_address_page(request: Request, api: AdminApi, token: str) -> Response:
    space, name = request.path_params["space"], request.path_params["name"]
    address = await api.address(space, name, token=token)
    form = AddressForm.from_address(address)
    return await _address_form_page(request, api, token, form=form, create=False)


async def save_address(request: Request, api: AdminApi, token: str) -> Response:
    space = request.path_params["space"]
    create = "name" not in request.path_params
    fields = _strings(await request.form())
    if not create:
        fields["name"] = request.path_params["name"]
    form = AddressForm.from_fields(fields)
    try:
        await api.write_address(form.to_address(space=space), create=create, token=token)
    except Refusal as refusal:
        if refusal.code == grpc.StatusCode.UNAUTHENTICATED:
            raise
        errors = field_errors(refusal.message, fields=ADDRESS_FIELDS)
        return await _address_form_page(
            request, api, token, form=form, create=create, errors=errors
        )
    return RedirectResponse(f"/spaces/{space}", status_code=303)


async def delete_address(request: Request, api: AdminApi, token: str) -> Response:
    space, name = request.path_params["space"], request.path_params["name"]
    await api.delete("Address", space, name, token=token)
    return RedirectResponse(f"/spaces/{space}", status_code=303)


# ---------------------------------------------------------------- messaging users


def _user_form_page(
    request: Request, *, form: UserForm, create: bool, errors: FieldErrors | None = None
) -> Response:
    context = {
        "space": request.path_params["space"],
        "form": form,
        "create": create,
        "errors": errors or {},
        "form_error": (errors or {}).get(FORM, ""),
    }
    status = 400 if errors else 200
    return templates.TemplateResponse(request, "user_form.html", context, status_code=status)


async def new_user_page(request: Request, api: AdminApi, token: str) -> Response:
    await api.address_space(request.path_params["space"], token=token)
    return _user_form_page(request, form=UserForm(), create=True)


async def edit_user_page(request: Request, api: AdminApi, token: str) -> Response:
    space, name = request.path_params["space"], request.path_params["name"]
    user = await api.user(space, name, token=token)
    return _user_form_page(request, form=UserForm.from_user(user), create=False)


async def save_user(request: Request, api: AdminApi, token: str) -> Response:
    space = request.path_params["space"]
    create = "name" not in request.path_params
    fields = _strings(await request.form())
    if not create:
        fields["name"] = request.path_params["name"]
    form = UserForm.from_fields(fields)
    if form.problems:
        return _user_form_page(request, form=form, create=create, errors=form.problems)
    try:
        await api.write_user(form.to_user(space=space), create=create, token=token)
    except Refusal as refusal:
        if refusal.code == grpc.StatusCode.UNAUTHENTICATED:
            raise
        errors = field_errors(refusal.message, fields=USER_FIELDS)
        return _user_form_page(request, form=form, create=create, errors=errors)
    return RedirectResponse(f"/spaces/{space}", status_code=303)


async def delete_user(request: Request, api: AdminApi, token: str) -> Response:
    space, name = request.path_params["space"], request.path_params["name"]
    await api.delete("MessagingUser", space, name, token=token)
    return RedirectResponse(f"/spaces/{space}", status_code=303)


def _strings(form: Mapping[str, Any]) -> dict[str, str]:
    return {key: value for key, value in form.items() if isinstance(value, str)}


# ---------------------------------------------------------------- the application


def create_app(
    *,
    open_api: Callable[[], AdminApi],
    data_plane: DataPlane | None = None,
    analytics: Path | None = None,
) -> Starlette:
    """The console; `open_api` is called once the server's event loop runs (grpc.aio channels
    belong to the loop that opened them) and its API closed at shutdown. Without `data_plane`
    the pages show what the admin API has (phases, placements, dead letters), no traffic;
    `analytics` is the folder of the analytics job's tables the trace views read."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.data_plane = data_plane
        app.state.analytics = analytics
        app.state.api = open_api()
        try:
            yield
        finally:
            await app.state.api.close()

    space = "/spaces/{space}"
    routes = [
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", signed_in(spaces_page)),
        Route(space, signed_in(space_page)),
        Route("/traces", signed_in(traces_page)),
        Route(f"{space}/addresses/{{name}}/traces", signed_in(address_traces_page)),
        Route(f"{space}/events", signed_in(space_events)),
        Route(f"{space}/connections", signed_in(connections_page), methods=["GET"]),
        Route(
            f"{space}/connections/{{router}}/{{id:int}}/close",
            signed_in(close_connection),
            methods=["POST"],
        ),
        Route(
            f"{space}/connections/{{router}}/{{id:int}}/links/close",
            signed_in(close_link),
            methods=["POST"],
        ),
        Route(f"{space}/addresses/new", signed_in(new_address_page), methods=["GET"]),
        Route(f"{space}/addresses/new", signed_in(save_address), methods=["POST"]),
        Route(f"{space}/addresses/{{name}}/edit", signed_in(edit_address_page), methods=["GET"]),
        Route(f"{space}/addresses/{{name}}/edit", signed_in(save_address), methods=["POST"]),
        Route(f"{space}/addresses/{{name}}/delete", signed_in(delete_address), methods=["POST"]),
        Route(f"{space}/users/new", signed_in(new_user_page), methods=["GET"]),
        Route(f"{space}/users/new", signed_in(save_user), methods=["POST"]),
        Route(f"{space}/users/{{name}}/edit", signed_in(edit_user_page), methods=["GET"]),
        Route(f"{space}/users/{{name}}/edit", signed_in(save_user), methods=["POST"]),
        Route(f"{space}/users/{{name}}/delete", signed_in(delete_user), methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
