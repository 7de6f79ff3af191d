# One image for the web app, the workers and Flower (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 CHATTTS_FARM_DATA_DIR=/data
WORKDIR /app

# Dependencies first, so code changes do not reinstall torch.
COPY pyproject.toml constraints.txt README.md ./
RUN mkdir worker web && touch worker/__init__.py web/__init__.py \
    && pip install --constraint constraints.txt --editable ".[all]"

COPY worker ./worker
COPY web ./web
COPY migrations ./migrations

EXPOSE 8000 5555
VOLUME ["/data"]
CMD ["chattts-farm", "web", "--host", "0.0.0.0", "--port", "8000"]
