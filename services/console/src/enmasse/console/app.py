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
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
from enmasse.console import live
from enmasse.console.admin_api import AdminApi, Refusal
from enmasse.console.data_plane import SAMPLE_SECONDS, DataPlane
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
    *, open_api: Callable[[], AdminApi], data_plane: DataPlane | None = None
) -> Starlette:
    """The console; `open_api` is called once the server's event loop runs (grpc.aio channels
    belong to the loop that opened them) and its API closed at shutdown. Without `data_plane`
    the pages show what the admin API has (phases, placements, dead letters), no traffic."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.data_plane = data_plane
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
        Route(f"{space}/events", signed_in(space_events)),
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
