"""A running Label Studio, through its HTTP API: the few calls a review round trip needs.

    create_project       a project with the labelling interface (assets/dataset/review_formats.py)
    connect_local_files  a local-files storage over the dataset's images, so that the tool
                         serves them itself (LOCAL_FILES_SERVING_ENABLED on the server)
    import_tasks         the tasks with their predictions, in batches
    export_answers       the JSON export of the tasks somebody answered

Tokens: a legacy API token goes in `Authorization: Token ...`; a personal access token (a JWT,
Label Studio 1.17 and later) is a refresh token, exchanged at /api/token/refresh for a
short-lived access token sent as `Bearer`. Every failure is a LabelStudioError that names the
call, the status and what the server said.
"""

from __future__ import annotations

from typing import Any

IMPORT_BATCH = 1000  # tasks per import request: large projects in requests of a few MB
TIMEOUT_S = 120.0
ERROR_TEXT_SHOWN = 300


class LabelStudioError(RuntimeError):
    """Label Studio could not be reached, or refused a call."""


class LabelStudio:
    def __init__(self, url: str, token: str, *, timeout: float = TIMEOUT_S):
        import requests

        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["Authorization"] = self._authorization(token)

    def _authorization(self, token: str) -> str:
        if token.count(".") != 2:  # not a JWT: a legacy token
            return f"Token {token}"
        refreshed = self._call("POST", "/api/token/refresh", json={"refresh": token}, auth=False)
        return f"Bearer {refreshed['access']}"

    def _call(self, method: str, path: str, *, auth: bool = True, **kwargs) -> Any:
        import requests

        send = self.session.request if auth else requests.request
        try:
            response = send(method, self.url + path, timeout=self.timeout, **kwargs)
        except requests.RequestException as error:
            raise LabelStudioError(f"cannot reach Label Studio at {self.url}: {error}") from None
        if response.status_code >= 400:
            hint = (
                " (check the token: LABEL_STUDIO_API_KEY or --token)"
                if response.status_code in (401, 403)
                else ""
            )
            raise LabelStudioError(
                f"Label Studio refused {method} {path}: HTTP {response.status_code}{hint}: "
                f"{response.text[:ERROR_TEXT_SHOWN]}"
            )
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise LabelStudioError(
                f"{self.url}{path} did not answer as Label Studio's API does (not JSON: "
                f"{response.text[:ERROR_TEXT_SHOWN]!r}); is Label Studio at {self.url}?"
            ) from None

    def create_project(self, title: str, label_config: str) -> int:
        project = self._call(
            "POST", "/api/projects", json={"title": title, "label_config": label_config}
        )
        return int(project["id"])

    def connect_local_files(self, project_id: int, path: str, title: str) -> None:
        """Let the project's tasks load images under `path`, which must be inside the server's
        LOCAL_FILES_DOCUMENT_ROOT (no sync: the tasks exist already)."""
        self._call(
            "POST",
            "/api/storages/localfiles",
            json={"project": project_id, "title": title, "path": path, "use_blob_urls": True},
        )

    def import_tasks(self, project_id: int, tasks: list[dict]) -> int:
        """Import `tasks` (with their predictions); returns how many the server took."""
        taken = 0
        for start in range(0, len(tasks), IMPORT_BATCH):
            done = self._call(
                "POST",
                f"/api/projects/{project_id}/import",
                json=tasks[start : start + IMPORT_BATCH],
            )
            taken += int(done["task_count"])
        return taken

    def export_answers(self, project_id: int) -> list[dict]:
        """The JSON export of the project's tasks that somebody answered (with annotations)."""
        return self._call(
            "GET", f"/api/projects/{project_id}/export", params={"exportType": "JSON"}
        )
