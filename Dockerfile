# The fleetloop image: every deployable (sim and executors, agent, worker, CLI) from one wheel.
FROM python:3.11.11-slim-bookworm
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY controllers ./controllers
COPY models ./models
COPY planning ./planning
COPY sre ./sre
COPY agents ./agents
COPY streams ./streams
COPY evaluations ./evaluations
COPY fleetloop ./fleetloop
COPY infra ./infra
COPY scenarios ./scenarios
RUN pip install --no-compile . && useradd --create-home fleetloop \
    && install -d -o fleetloop /home/fleetloop/spool
USER fleetloop
ENTRYPOINT ["fleetloop"]
