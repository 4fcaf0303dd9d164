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
COPY bench ./bench
COPY manage.py ./
RUN pip install --no-cache-dir . \
 && mkdir -p /var/lib/tessera \
 && DJANGO_SETTINGS_MODULE=portal.settings python manage.py collectstatic --noinput -v0

EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "portal.asgi:application"]
