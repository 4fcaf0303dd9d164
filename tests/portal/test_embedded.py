"""The embedded default: no DATABASE_URL or REDIS_URL means SQLite, an in-memory channel layer, eager tasks."""

import json
import os
import re
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.support import demo_start, wait_for

ROOT = Path(__file__).resolve().parents[2]


def _embedded_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"}}
    env.update(TESSERA_VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="portal.settings", **extra)
    return env


def _settings(env: dict[str, str]) -> dict[str, str]:
    code = (
        "from django.conf import settings as s;"
        "print(s.DATABASES['default']['ENGINE']); print(s.CHANNEL_LAYERS['default']['BACKEND']);"
        "print(s.CELERY_TASK_ALWAYS_EAGER); print(s.SECRET_KEY)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    engine, layer, eager, key = out.stdout.split("\n")[:4]
    return {"engine": engine, "layer": layer, "eager": eager, "key": key}


def test_with_no_configuration_it_runs_embedded(tmp_path):
    found = _settings(_embedded_env(tmp_path))
    assert found["engine"] == "django.db.backends.sqlite3"
    assert found["layer"] == "channels.layers.InMemoryChannelLayer"
    assert found["eager"] == "True"


def test_database_and_redis_urls_switch_to_postgres_and_redis(tmp_path):
    found = _settings(
        _embedded_env(
            tmp_path, DATABASE_URL="postgres://u@127.0.0.1:5432/x", REDIS_URL="redis://127.0.0.1:6379/3"
        )
    )
    assert found["engine"] == "django.db.backends.postgresql"
    assert found["layer"] == "channels_redis.core.RedisChannelLayer"
    assert found["eager"] == "False"


def test_a_secret_may_come_from_a_file(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("from-a-file-" + "x" * 50)
    assert _settings(_embedded_env(tmp_path, SECRET_KEY_FILE=str(secret)))["key"] == secret.read_text()


def test_an_empty_database_url_means_the_embedded_default(tmp_path):
    assert _settings(_embedded_env(tmp_path, DATABASE_URL=""))["engine"] == "django.db.backends.sqlite3"


PRODUCTION = {
    "SECRET_KEY": secrets.token_urlsafe(50),
    "ALLOWED_HOSTS": "tessera.example.org",
    "SESSION_COOKIE_SECURE": "1",
    "CSRF_COOKIE_SECURE": "1",
    "SECURE_SSL_REDIRECT": "1",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
    "SECURE_HSTS_PRELOAD": "1",
    "TRUSTED_PROXIES": "127.0.0.1",  # the TLS proxy on this host (else /metrics would trust every client: W001)
}


def _check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


def test_check_deploy_passes_on_production_settings(tmp_path):
    result = _check_deploy(_embedded_env(tmp_path, **PRODUCTION))
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_deploy_refuses_the_embedded_secret_key(tmp_path):
    production_without_key = {k: v for k, v in PRODUCTION.items() if k != "SECRET_KEY"}
    result = _check_deploy(_embedded_env(tmp_path, **production_without_key))
    assert result.returncode != 0 and "security.W009" in result.stdout + result.stderr


class _Embedded(tuple):
    """(url, what load_demo printed, env, var dir), and the demo's process (`process`, its group's leader)."""

    process: subprocess.Popen


@pytest.fixture(scope="module")
def embedded_server(tmp_path_factory):
    """What `make demo` runs: migrate, load the demo, then the portal, the scheduling loop and simulated agents,
    all on SQLite with no Redis."""
    var = tmp_path_factory.mktemp("embedded")
    env = _embedded_env(var)
    demo = demo_start(env, ROOT, var / "demo.log")
    running = _Embedded((demo.url, demo.loaded, env, var))
    running.process = demo.process
    try:
        yield running
    finally:
        if demo.process.poll() is None:  # else a test stopped it (as Ctrl-C does)
            os.killpg(demo.process.pid, signal.SIGTERM)
            try:
                demo.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(demo.process.pid, signal.SIGKILL)
                demo.process.wait()


def test_the_demo_serves_the_portal_and_the_admin_with_no_services(embedded_server):
    base, logins, _, _ = embedded_server
    assert "admin  / tessera-admin" in logins
    home = requests.get(f"{base}/", timeout=30)
    assert home.status_code == 200 and "A100-80GB" in home.text and "/login/" in home.text
    session = requests.Session()
    login_page = session.get(f"{base}/admin/login/", timeout=30)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page.text).group(1)
    response = session.post(
        f"{base}/admin/login/?next=/admin/",
        data={
            "csrfmiddlewaretoken": token,
            "username": "admin",
            "password": "tessera-admin",
            "next": "/admin/",
        },
        headers={"Referer": f"{base}/admin/login/"},
        timeout=30,
    )
    assert response.status_code == 200 and "Tessera administration" in response.text
    assert session.get(f"{base}/static/admin/css/base.css", timeout=30).status_code == 200


@pytest.mark.timeout(120, func_only=True)  # about 20 s
def test_the_readme_first_job_runs_on_the_embedded_demo(embedded_server):
    """The README's three commands (login, submit, ls) against what `make demo` serves; the job then runs on a
    simulated agent to success and its output is readable with `tessera logs`."""
    base, _, env, var = embedded_server
    cli_env = {**env, "TESSERA_CONFIG": str(var / "cli.json")}
    tessera = [sys.executable, "-m", "cli"]

    def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
        return subprocess.run(
            [*tessera, *args], env=cli_env, cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=60
        )

    login = cli("login", "--url", base, "--username", "alice", "--password-stdin", stdin="tessera-demo\n")
    assert login.returncode == 0, login.stderr
    submit = cli(
        "submit", "-G", "1", "-t", "2h", "--json", "--", "python", "-c", "print('hello from tessera')"
    )
    assert submit.returncode == 0, submit.stderr
    job_id = json.loads(submit.stdout)["id"]

    def ended() -> str | None:
        listed = cli("ls", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)
        rows = rows["results"] if isinstance(rows, dict) else rows
        state = next(row["state"] for row in rows if row["id"] == job_id)
        return state if state in ("succeeded", "failed") else None

    state = wait_for(f"job {job_id} to end", ended, timeout_s=20, interval_s=0.5)
    assert state == "succeeded", (state, (var / "demo.log").read_text()[-3000:])

    def logged() -> subprocess.CompletedProcess | None:
        logs = cli("logs", str(job_id))
        return logs if "hello from tessera" in logs.stdout else None

    # The agent ships log chunks every couple of seconds.
    try:
        wait_for("its output in `tessera logs`", logged, timeout_s=20, interval_s=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the demo printed:\n{(var / 'demo.log').read_text()[-6000:]}") from None


@pytest.mark.django_db
def test_loading_the_demo_twice_keeps_one_copy():
    from demo.seed import load_demo
    from scheduling.inventory.models import Gpu, Node
    from scheduling.inventory.selectors import overcommitted_gpus
    from scheduling.jobs.models import Job

    load_demo()
    counts = (Node.objects.count(), Gpu.objects.count(), Job.objects.count())
    load_demo()
    assert (Node.objects.count(), Gpu.objects.count(), Job.objects.count()) == counts
    assert counts[0] == 6 and counts[1] == 44
    assert set(Job.objects.values_list("state", flat=True)) >= {"succeeded", "failed", "running", "pending"}
    assert not overcommitted_gpus().exists()


def test_channel_layer_reads_outlast_its_blocking_waits(settings):
    """redis-py times reads out after 5 s by default, exactly channels_redis's BZPOPMIN wait: idle consumers
    (agents' sockets) would be dropped on a busy host."""
    from channels_redis.core import RedisChannelLayer

    if settings.CHANNEL_LAYERS["default"]["BACKEND"] != "channels_redis.core.RedisChannelLayer":
        pytest.skip("REDIS_URL is not set: the in-memory channel layer has no socket")
    host = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0]
    assert host["socket_timeout"] > RedisChannelLayer.brpop_timeout


@pytest.mark.timeout(120, func_only=True)  # about 35 s
def test_the_embedded_demo_takes_a_flood_of_submits_retries_and_cancels_without_a_server_error(
    embedded_server,
):
    """Eight clients at once against the SQLite demo: every answer a 2xx (or the API's own 4xx), never a 500
    'database is locked'."""
    from concurrent.futures import ThreadPoolExecutor

    base, _, _, _ = embedded_server
    token = requests.post(
        f"{base}/api/v1/auth/token/", json={"username": "alice", "password": "tessera-demo"}, timeout=30
    ).json()["token"]
    auth = {"Authorization": f"Bearer {token}"}
    spec = {
        "name": "flood",
        "command": "sleep 1",
        "gpu_memory": "1GiB",
        "compute_pct": 5,
        "team": "ai-lab/training",
    }

    def client(n: int) -> list[int]:
        session = requests.Session()
        statuses = []
        for i in range(12):
            key = f"flood-{n}-{i // 2}"  # every submit is sent twice with one Idempotency-Key
            r = session.post(
                f"{base}/api/v1/jobs/", json=spec, headers={**auth, "Idempotency-Key": key}, timeout=60
            )
            statuses.append(r.status_code)
            if i % 4 == 3 and r.status_code == 201:
                statuses.append(
                    session.post(
                        f"{base}/api/v1/jobs/{r.json()['id']}/cancel/", headers=auth, timeout=60
                    ).status_code
                )
            statuses.append(session.get(f"{base}/api/v1/queue/", headers=auth, timeout=60).status_code)
        return statuses

    with ThreadPoolExecutor(8) as pool:
        statuses = [s for result in pool.map(client, range(8)) for s in result]
    assert statuses and all(s < 500 for s in statuses), sorted(set(statuses))
    assert statuses.count(201) >= 8 * 6  # each key submits once; its retry replays (201 again) or conflicts


def _processes_mentioning(text: str) -> list[str]:
    """Live processes whose command line mentions `text` (the demo's var dir: its agents, their supervisors)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in args and state != "Z":
            found.append(f"{entry.name}: {args.strip()}")
    return found


def test_ctrl_c_stops_the_demo_and_all_it_started_and_frees_its_port(embedded_server):
    """Last in this file: it stops the module's demo as a terminal's Ctrl-C does (SIGINT to its process group)."""
    base, _, _, var = embedded_server
    demo = embedded_server.process
    wait_for(
        "the demo's agents to run jobs",
        lambda: list(var.glob("demo-agents/*/jobs/*/*/job.json")),
        timeout_s=60,
    )
    assert _processes_mentioning(str(var)), "nothing of the demo's to stop"
    os.killpg(demo.pid, signal.SIGINT)
    demo.wait(timeout=15)  # it hung for ever when Ctrl-C came during a scheduling cycle
    wait_for("no process of the demo left", lambda: not _processes_mentioning(str(var)), timeout_s=5)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{base}/healthz", timeout=5)


def test_the_demo_plays_each_missing_script_as_what_it_is(tmp_path):
    from demo.management.commands.run_demo import write_stand_ins

    write_stand_ins(tmp_path)
    env = {**os.environ, "TESSERA_DEMO_STEPS": "2", "TESSERA_DEMO_STEP_S": "0"}

    def log_of(script: str) -> str:
        run = subprocess.run(
            [str(tmp_path / "python"), script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert run.returncode == 0, run.stderr
        return run.stdout

    serve = log_of("serve.py")  # an inference server printed training steps and a falling loss
    assert "serving on" in serve and "served" in serve and "loss" not in serve
    assert "documents embedded" in log_of("embed.py")
    assert "step 2/2 loss=0.333" in log_of("train.py")
