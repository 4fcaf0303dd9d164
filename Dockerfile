# One image for the portal's processes: web (daphne), Celery worker, Celery beat, and the simulated node agent.
# docker-compose.yml picks the process with `command:`; docs/operations.md explains each. Real GPU hosts run the
# agent under systemd instead (deploy/systemd/tessera-agent.service): a container's stop kills its jobs.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 TESSERA_VAR_DIR=/var/lib/tessera
WORKDIR /app
COPY pyproject.toml README.md requirements.lock ./
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
# The portal's own dependencies and the `agent` extra (NVML, the websocket client): the simulated agent runs from
# this image too. The simulator's extra (`sim`: plots, progress bars) stays out. Every version is the lock's
# (requirements.lock, resolved from pyproject.toml): the image built next month has what was tested. The `ldap`
# extra (sign-in through the site's directory) builds python-ldap with gcc, removed after, against libldap's
# headers, kept with the libraries it links.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev libldap2-dev libsasl2-dev \
 && pip install --no-cache-dir -c requirements.lock '.[agent,ldap]' \
 && apt-get purge -y --auto-remove gcc && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/tessera --shell /usr/sbin/nologin tessera \
 && mkdir -p /var/lib/tessera/logs /var/lib/tessera/metrics /var/lib/tessera-agent \
 && DJANGO_SETTINGS_MODULE=portal.settings python manage.py collectstatic --noinput -v0 \
 && chown tessera:tessera /var/lib/tessera /var/lib/tessera/logs /var/lib/tessera/metrics /var/lib/tessera-agent
USER tessera

# With TESSERA_METRICS_SHARED_DIR set (web and worker in compose share a metrics volume), each container gets a
# directory of its own there (counters kept across restarts) as its PROMETHEUS_MULTIPROC_DIR: containers are all pid 1, and
# prometheus-client names its files by pid (scheduling/observability/metrics_dir.py). Otherwise it only execs.
ENTRYPOINT ["python", "-m", "scheduling.observability.metrics_dir", "--"]
EXPOSE 8000
CMD ["daphne", "-v", "0", "-b", "0.0.0.0", "-p", "8000", "portal.asgi:application"]
