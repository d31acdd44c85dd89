# One image for the proxy, the autoscaler and the look-alike engines.
FROM python:3.11-slim AS requirements
COPY pyproject.toml /
RUN python -c "import tomllib; t = tomllib.load(open('/pyproject.toml', 'rb')); p = t['project']; \
print('\n'.join(t['build-system']['requires'] + p['dependencies'] + p['optional-dependencies']['k8s']))" \
      > /requirements.txt

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN useradd --create-home --uid 10001 flotilla
WORKDIR /app
# The dependencies first, so a change of the sources rebuilds only the small layers below, and
# a change of pyproject.toml other than its requirements reuses them too. The k8s extra: the
# proxy's Kubernetes actuator and --discover k8s:SERVICE (deploy/k8s).
COPY --from=requirements /requirements.txt /tmp/
RUN pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY pyproject.toml README.md ./
COPY flotilla ./flotilla
COPY fake_engines ./fake_engines
COPY policies ./policies
COPY proxy ./proxy
COPY loadgen ./loadgen
COPY sim ./sim
RUN pip install --no-deps --no-build-isolation '.[k8s]'

USER flotilla
EXPOSE 8000
# Whichever server the container runs (proxy, fake-vllm, fake-llama-server, on any port), its /health.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 CMD ["python", "-m", "flotilla.healthcheck"]
CMD ["flotilla", "--help"]
