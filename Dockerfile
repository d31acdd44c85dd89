# One image for the proxy, the autoscaler and the look-alike engines.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN useradd --create-home --uid 10001 flotilla
WORKDIR /app
COPY pyproject.toml README.md ./
COPY flotilla ./flotilla
COPY fake_engines ./fake_engines
COPY policies ./policies
COPY proxy ./proxy
COPY loadgen ./loadgen
COPY sim ./sim
# the k8s extra: the proxy's Kubernetes actuator and --discover k8s:SERVICE (deploy/k8s)
RUN pip install '.[k8s]'

USER flotilla
EXPOSE 8000
CMD ["flotilla", "--help"]
