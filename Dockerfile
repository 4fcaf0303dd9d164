# One image for every Tessera process: web (daphne), Celery worker, Celery beat and the node agent.
# docker-compose.yml picks the process with `command:`; docs/operations.md explains each.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 TESSERA_VAR_DIR=/var/lib/tessera
WORKDIR /app
COPY pyproject.toml README.md ./
COPY portal ./portal
COPY quotas ./quotas
COPY scheduling ./scheduling
COPY agent ./agent
COPY frontend ./frontend
COPY cli ./cli
COPY demo ./demo
COPY manage.py ./
# Every process runs as an unprivileged user of its own, which owns only the directories it writes (the code and
# the collected static files stay root's): the portal's state and logs, and an agent's work dir. Named volumes
# mounted there start out owned by it.
# The portal's own dependencies and the `agent` extra (NVML, the websocket client): the node agent runs from this
# image too. The simulator's extra (`sim`: plots, progress bars) stays out.
RUN pip install --no-cache-dir '.[agent]' \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/tessera --shell /usr/sbin/nologin tessera \
 && mkdir -p /var/lib/tessera/logs /var/lib/tessera/metrics /var/lib/tessera-agent \
 && DJANGO_SETTINGS_MODULE=portal.settings python manage.py collectstatic --noinput -v0 \
 && chown tessera:tessera /var/lib/tessera /var/lib/tessera/logs /var/lib/tessera/metrics /var/lib/tessera-agent
USER tessera

EXPOSE 8000
CMD ["daphne", "-v", "0", "-b", "0.0.0.0", "-p", "8000", "portal.asgi:application"]
