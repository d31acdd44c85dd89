# One image for the proxy, the autoscaler and the look-alike engines.
FROM python:3.11-slim AS requirements
COPY pyproject.toml /
# What the image runs with (the dependencies and the k8s extra: the proxy's Kubernetes actuator and
# --discover k8s:SERVICE, deploy/k8s), and what building its wheel adds: setuptools and the compile
# extra (mypy, whose mypyc compiles the request path: setup.py).
RUN python -c "import tomllib; t = tomllib.load(open('/pyproject.toml', 'rb')); p = t['project']; \
x = p['optional-dependencies']; \
print('\n'.join(p['dependencies'] + x['k8s']), file=open('/requirements.txt', 'w')); \
print('\n'.join(t['build-system']['requires'] + x['compile']), file=open('/build-requirements.txt', 'w'))"

# The wheel, its request path compiled to C extensions with mypyc: a C compiler here, none in the image.
FROM python:3.11-slim AS wheel
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
ENV PIP_NO_CACHE_DIR=1
COPY --from=requirements /requirements.txt /build-requirements.txt /tmp/
RUN pip install -r /tmp/requirements.txt -r /tmp/build-requirements.txt
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY scripts/build ./scripts/build
COPY flotilla ./flotilla
COPY fake_engines ./fake_engines
COPY policies ./policies
COPY proxy ./proxy
COPY loadgen ./loadgen
COPY sim ./sim
# FLOTILLA_COMPILE=1: a build that cannot compile fails here instead of shipping plain Python.
RUN FLOTILLA_COMPILE=1 pip wheel --no-deps --no-build-isolation -w /wheels .

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN useradd --create-home --uid 10001 flotilla
WORKDIR /app
# The dependencies first, so a change of the sources rebuilds only the small layers below, and
# a change of pyproject.toml other than its requirements reuses them too.
COPY --from=requirements /requirements.txt /tmp/
RUN pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
# The package from its wheel alone: no sources in the working directory, which would come first
# on sys.path and hide the compiled modules.
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-deps /tmp/wheels/*.whl && rm -rf /tmp/wheels

USER flotilla
EXPOSE 8000
# Whichever server the container runs (proxy, fake-vllm, fake-llama-server, on any port), its /health.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 CMD ["python", "-m", "flotilla.healthcheck"]
CMD ["flotilla", "--help"]
