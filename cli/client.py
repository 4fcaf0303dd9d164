"""A small HTTP client for the Tessera API, used by the `tessera` CLI. Imports no Django: the CLI starts fast.

Configuration lives in $TESSERA_CONFIG or ~/.config/tessera/config.json ({"url", "token", "username"});
TESSERA_URL and TESSERA_TOKEN override it.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

DEFAULT_URL = "http://127.0.0.1:8000"
TIMEOUT_S = 30


class ExitCode:
    """The CLI's exit codes, documented in docs/api.md."""

    OK = 0
    ERROR = 1  # anything unexpected
    USAGE = 2  # bad flags or an unreadable spec file
    NOT_LOGGED_IN = 3  # no token, or the server refused it (401)
    FORBIDDEN = 4  # 403
    NOT_FOUND = 5  # 404
    INVALID = 6  # 400: the server refused the request (e.g. a spec that can never run)
    CONFLICT = 7  # 409: e.g. cancelling a finished job, an Idempotency-Key reused with another body
    THROTTLED = 8  # 429
    UNAVAILABLE = 9  # the server cannot be reached, or answered 5xx


_EXIT_BY_STATUS = {
    400: ExitCode.INVALID,
    401: ExitCode.NOT_LOGGED_IN,
    403: ExitCode.FORBIDDEN,
    404: ExitCode.NOT_FOUND,
    409: ExitCode.CONFLICT,
    422: ExitCode.INVALID,
    429: ExitCode.THROTTLED,
}


class ApiError(Exception):
    """A refused or failed request, with the API's error fields and the exit code it maps to."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str = "error",
        field: str | None = None,
        limit: Any = None,
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.field = field
        self.limit = limit

    @property
    def exit_code(self) -> int:
        if self.status is None or self.status >= 500:
            return ExitCode.UNAVAILABLE
        return _EXIT_BY_STATUS.get(self.status, ExitCode.ERROR)

    def __str__(self) -> str:
        text = self.message
        if self.field and self.field not in text:
            text = f"{self.field}: {text}"
        if self.limit is not None and str(self.limit) not in text:
            text += f" (limit: {self.limit})"
        return text


def config_path() -> Path:
    configured = os.environ.get("TESSERA_CONFIG")
    if configured:
        return Path(configured)
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "tessera" / "config.json"


def config_load() -> dict[str, Any]:
    try:
        data = json.loads(config_path().read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        data = {}
    if os.environ.get("TESSERA_URL"):
        data["url"] = os.environ["TESSERA_URL"]
    if os.environ.get("TESSERA_TOKEN"):
        data["token"] = os.environ["TESSERA_TOKEN"]
    return data


def config_save(data: dict[str, Any]) -> Path:
    """Write the config readable by its owner only: it holds a token."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out, indent=2)
    os.replace(tmp, path)
    return path


@dataclass
class Client:
    url: str
    token: str | None = None

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "tessera-cli/1"
        if self.token:
            self.session.headers["Authorization"] = f"Bearer {self.token}"

    @classmethod
    def from_config(cls) -> Client:
        data = config_load()
        if not data.get("token"):
            raise ApiError("Not logged in: run `tessera login` first.", status=401, code="not_authenticated")
        return cls(url=data.get("url") or DEFAULT_URL, token=data["token"])

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", TIMEOUT_S)
        try:
            response = self.session.request(method, f"{self.url}{path}", **kwargs)
        except requests.RequestException as exc:
            raise ApiError(f"Cannot reach {self.url}: {exc.__class__.__name__}", status=None) from None
        if response.status_code >= 400:
            raise _error_from(response)
        return response

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None}).json()

    def post(self, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        return self.request("POST", path, json=body, headers=headers or {}).json()

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path).json()

    def get_all(self, path: str, *, limit: int = 10_000, **params: Any) -> list[dict[str, Any]]:
        """Every row of a paginated list, up to limit."""
        rows: list[dict[str, Any]] = []
        page = 1
        while len(rows) < limit:
            body = self.get(path, page=page, page_size=min(500, limit), **params)
            rows.extend(body["results"])
            if not body.get("next"):
                break
            page += 1
        return rows[:limit]

    # -- the calls the CLI makes ---------------------------------------------------------------------------
    def login(self, *, username: str, password: str, name: str) -> dict[str, Any]:
        return self.post("/api/v1/auth/token/", {"username": username, "password": password, "name": name})

    def whoami(self) -> dict[str, Any]:
        return self.get("/api/v1/whoami/")

    def submit(self, spec: dict[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        key = idempotency_key or str(uuid.uuid4())  # a retry of this call must not submit twice
        return self.post("/api/v1/jobs/", spec, headers={"Idempotency-Key": key})

    def job(self, job_id: int) -> dict[str, Any]:
        return self.get(f"/api/v1/jobs/{int(job_id)}/")

    def events(self, job_id: int) -> list[dict[str, Any]]:
        return self.get_all(f"/api/v1/jobs/{int(job_id)}/events/")

    def cancel(self, job_id: int, *, tasks: str | None = None) -> dict[str, Any]:
        """Cancel a job (an array's line: all of it); `tasks` only those tasks of its array (e.g. 3-7)."""
        return self.post(
            f"/api/v1/jobs/{int(job_id)}/cancel/", {"tasks": tasks} if tasks is not None else None
        )

    def logs(
        self,
        job_id: int,
        *,
        stream: str = "stdout",
        tail: int | None = None,
        offset: int | None = None,
        encoding: str | None = None,
    ) -> dict:
        return self.get(
            f"/api/v1/jobs/{int(job_id)}/logs/", stream=stream, tail=tail, offset=offset, encoding=encoding
        )


def _error_from(response: requests.Response) -> ApiError:
    try:
        error = response.json().get("error") or {}
    except (ValueError, AttributeError):
        error = {}
    message = (
        error.get("message") or f"HTTP {response.status_code} from {response.request.method} {response.url}"
    )
    return ApiError(
        message,
        status=response.status_code,
        code=error.get("code", "error"),
        field=error.get("field"),
        limit=error.get("limit"),
    )
