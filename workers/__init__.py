"""Celery workers: the Celery app, tasks, the engine host and the engines."""
